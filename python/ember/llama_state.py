"""llama-cpp-python's saved states and prompt caches for `Llama`: LlamaState (what save_state
returns, picklable), LlamaRAMCache and LlamaDiskCache (set_cache). A state is the context's
tokens and their logits rows; loading one re-evaluates the tokens past what the context already
holds of them (ember's KV lives in its paged pool and is not copied out), so a state restores the
same context on any Llama of the same model."""
from __future__ import annotations

import abc
import collections
import hashlib
import os
import pickle
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np


@dataclass
class LlamaState:
    """input_ids: the tokens the context held; scores: their logits rows ([n_tokens, n_vocab],
    NaN where a row was not kept), or None; seed: the Llama's seed then."""
    input_ids: np.ndarray
    scores: Optional[np.ndarray]
    n_tokens: int
    seed: int

    @property
    def llama_state_size(self) -> int:
        """The state's size in bytes (what the caches count against their capacity)."""
        return self.input_ids.nbytes + (self.scores.nbytes if self.scores is not None else 0)


def _key(tokens: Sequence[int]) -> Tuple[int, ...]:
    return tuple(int(t) for t in tokens)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class BaseLlamaCache(abc.ABC):
    """A cache of states keyed by their tokens; a lookup finds the state sharing the longest prefix
    with the tokens asked for (llama-cpp-python's). capacity_bytes bounds what it holds."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)

    @abc.abstractmethod
    def _keys(self):
        """The token tuples of the states this cache holds (each kind of cache lists its own)."""

    def _find_prefix_key(self, key: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
        best, best_len = None, 0
        for k in self._keys():
            n = _common(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_prefix_key(_key(key)) is not None


class LlamaRAMCache(BaseLlamaCache):
    """States in memory, least recently used dropped first past capacity_bytes."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_state: "collections.OrderedDict[Tuple[int, ...], LlamaState]" = collections.OrderedDict()

    def _keys(self):
        return list(self.cache_state)

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_prefix_key(_key(key))
        if found is None:
            raise KeyError("Key not found")
        self.cache_state.move_to_end(found)
        return self.cache_state[found]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = _key(key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and len(self.cache_state) > 1:
            self.cache_state.popitem(last=False)


class LlamaDiskCache(BaseLlamaCache):
    """States pickled into files of cache_dir (made if missing; pickles are code: a folder only you write),
    least recently used dropped first past capacity_bytes."""

    def __init__(self, cache_dir: str = ".cache/llama_cache", capacity_bytes: int = 2 << 30):
        super().__init__(capacity_bytes)
        self.cache_dir = str(cache_dir)
        os.makedirs(self.cache_dir, exist_ok=True)

    def _path(self, key: Tuple[int, ...]) -> str:
        # A content hash that is the same in every process (Python's hash() is salted per run).
        return os.path.join(self.cache_dir, hashlib.sha256(np.asarray(key, dtype=np.int64).tobytes()).hexdigest()
                            + ".state")

    def _entries(self):
        out = []
        for name in os.listdir(self.cache_dir):
            if name.endswith(".state"):
                path = os.path.join(self.cache_dir, name)
                out.append((os.path.getmtime(path), path))
        return sorted(out)

    def _load(self, path: str) -> Tuple[Tuple[int, ...], LlamaState]:
        with open(path, "rb") as f:
            return pickle.load(f)

    def _keys(self):
        return [self._load(path)[0] for _, path in self._entries()]

    @property
    def cache_size(self) -> int:
        return sum(os.path.getsize(path) for _, path in self._entries())

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        found = self._find_prefix_key(_key(key))
        if found is None:
            raise KeyError("Key not found")
        path = self._path(found)
        os.utime(path)
        return self._load(path)[1]

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        key = _key(key)
        with open(self._path(key), "wb") as f:
            pickle.dump((key, value), f)
        entries = self._entries()
        while sum(os.path.getsize(p) for _, p in entries) > self.capacity_bytes and len(entries) > 1:
            os.remove(entries.pop(0)[1])
