"""The `Llama` class: llama-cpp-python's high-level API (create_completion, streaming, stop strings,
logprobs, prefix reuse, chat formats, saved states and caches, scores with logits_all; embeddings
with embedding=True) over ember's Model / Context / Sampler, with detokenize.py's text, stop
strings and logprobs."""
from __future__ import annotations

import collections
import contextlib
import contextvars
import glob
import os
import sys
import threading
import time
import uuid
from typing import Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _ember
from . import hf_cache
from .chat import ChatTemplate, chat_chunks, chat_completion
from .chat.formats import chat_format_template
from .chat.constrain import after_thinking, spelling
from .chat.reasoning import ReasoningParser
from .detokenize import Detokenizer, completion_logprob_entry, empty_completion_logprobs, log_softmax, piece_text
from .embedding import POOLING_RANK, POOLING_UNSPECIFIED, Embedder, embed_tokens, is_encoder, resolve_pooling
from .llama_state import BaseLlamaCache, LlamaState
from .options import LLAMA, context_size, fill, resolve, signature
from .prompt import encode_prompt
from .structured import LlamaGrammar, StructuredOutputsParams, response_format_params

DEFAULT_SEED = 0xFFFFFFFF   # "draw a random seed", as in llama.cpp

class _ContextLock:
    """Serializes the use of one Llama's context between threads. A call holds it while it runs
    (reentrant, as an RLock). A completion also claims the context until it ends, a stream from
    its first chunk until it is exhausted or closed, so that another thread waits for it instead
    of cutting in. The thread that last advanced the claiming completion may still call in, as
    single-threaded code interleaving a stream with other calls does: a completion it starts then
    abandons the stream (which raises when next advanced), as it always has.

    A stream may be advanced from different threads (a server's thread pool does): the lock is
    taken and released around each step, within one thread, and only the claim moves along."""

    def __init__(self):
        self._cond = threading.Condition(threading.RLock())
        self._claim = None     # the _Generation holding the context between its steps
        self._claimer = None   # the thread that last ran it

    @contextlib.contextmanager
    def hold(self, claim=None, start: bool = False):
        """Holds the context for a call; with claim, for a step of that completion (start: its
        first, which takes the claim over)."""
        me = threading.get_ident()
        with self._cond:
            while self._claim is not None and self._claim is not claim and self._claimer != me:
                self._cond.wait()
            if start or (claim is not None and self._claim is claim):
                self._claim, self._claimer = claim, me
            yield

    def end(self, claim) -> None:
        """The completion `claim` has ended: another thread's call may go ahead."""
        with self._cond:
            if self._claim is claim:
                self._claim = self._claimer = None
                self._cond.notify_all()


# Set while create_chat_completion runs create_completion for a model whose thinking is marked by special
# tokens (gpt-oss's harmony channels): the completion's text keeps special tokens' text without create_completion,
# llama-cpp-python's signature, taking an argument of ember's own.
_KEEP_SPECIAL: contextvars.ContextVar = contextvars.ContextVar("ember_llama_keep_special", default=False)


class _Generation:
    """State of one completion: settled by create_completion before any token is generated, so
    bad arguments raise at call time even when streaming."""

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.completion_tokens: List[int] = []
        self.records: list = []        # per completion token: (start offset in its text, logprob entry)
        self.finish_reason = "length"


class Llama:
    """A GGUF model plus one inference context, with llama-cpp-python's `Llama` API."""

    def __init__(self, model_path: str, **kwargs):
        """kwargs: the options docs/options.md lists for Llama (llama-cpp-python's names and
        defaults: n_ctx=512, n_gpu_layers=0, type_k / type_v as ggml type ids or names, ...)."""
        o = resolve(LLAMA, kwargs)
        n_ctx, type_k, type_v = o["n_ctx"], o["type_k"], o["type_v"]
        self.model_path = str(model_path)
        self.verbose = o["verbose"]
        self._seed = self._check_seed(o["seed"])
        self._last_n = o["last_n_tokens_size"]
        self._lock = _ContextLock()
        t0 = time.perf_counter()
        self._model = _ember.Model(self.model_path, fill(_ember.ModelParams(), o))
        self._tok = self._model.tokenizer
        # embedding=True: the context keeps hidden states instead of logits (no completions).
        self._embedding = o["embedding"]
        self._pooling = resolve_pooling(self._model, o["pooling_type"]) if self._embedding else POOLING_UNSPECIFIED
        n_ctx = context_size(self._model, n_ctx)
        self._n_batch = min(o["n_batch"], n_ctx)
        if is_encoder(self._model) or self._pooling == POOLING_RANK:
            # Encoders and rank heads run through an Embedder (it packs several texts into one forward).
            if not self._embedding:
                raise ValueError(f"Llama: {self._model.arch} is an encoder model: it embeds (and ranks) but does "
                                 f"not generate; create it with embedding=True")
            self._ctx = Embedder(self._model, n_ctx, self._pooling, self._n_batch, o["n_threads"] or 0)
        else:
            self._ctx = _ember.Context(self._model, fill(_ember.ContextParams(), o, n_ctx=n_ctx,
                                                         n_batch=self._n_batch))
        self._history: List[int] = []   # the tokens whose KV the context holds, in order
        self._generation = 0             # bumped as each completion starts, to retire stale streams
        self._chat_format = o["chat_format"]
        if self._chat_format is not None:
            chat_format_template(self._chat_format)   # an unknown name fails here, not at the first chat
        self._chat_template: Optional[ChatTemplate] = None   # made at the first chat
        # logits_all: every evaluated position's logits row is kept (scores, eval_logits), one per
        # _history token; otherwise only the context's last row is there to read.
        self._logits_all = o["logits_all"]
        self._rows: List[np.ndarray] = []
        self.cache: Optional[BaseLlamaCache] = None
        self._grammars = None   # the vocabulary as llguidance sees it, made at the first grammar
        if self.verbose:
            m = self._model
            print(f"ember: loaded {self.model_path} (arch {m.arch}, {m.n_layer} layers, n_embd {m.n_embd}, "
                  f"n_vocab {m.n_vocab}, {m.n_gpu_layers} GPU layers) with n_ctx {self._ctx.n_ctx} "
                  f"(KV cache K {type_k}, V {type_v}) in {time.perf_counter() - t0:.2f} s", file=sys.stderr)

    __init__.__signature__ = signature(LLAMA, __init__)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, local_dir: Optional[str] = None,
                        cache_dir: Optional[str] = None, revision: str = "main", **kwargs) -> "Llama":
        """llama-cpp-python's: the GGUF filename (a name or a glob such as "*q4_k_m.gguf") of the
        Hugging Face repository repo_id, from the local Hugging Face cache (cache_dir: another
        cache folder; local_dir: a folder holding the file itself). ember downloads nothing: a file
        not there raises FileNotFoundError saying how to fetch it. kwargs: as Llama's."""
        if local_dir is not None:
            matches = sorted(glob.glob(os.path.join(glob.escape(str(local_dir)), filename)))
            if len(matches) != 1:
                raise FileNotFoundError(f"from_pretrained: {len(matches)} files match {filename!r} in {local_dir}")
            return cls(matches[0], **kwargs)
        return cls(hf_cache.resolve(repo_id, filename, cache_dir, revision), **kwargs)

    @property
    def metadata(self) -> Dict[str, str]:
        """The GGUF's metadata as llama-cpp-python gives it: {key: value as a string}, arrays
        (the vocabulary, merges) left out."""
        out = {}
        for key, value in _ember.GGUFFile(self.model_path).metadata().items():
            if isinstance(value, list):
                continue
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Frees the context and the model; the object is unusable afterwards."""
        with self._lock.hold():
            self._ctx = None
            self._tok = None
            self._model = None
            self._history = []

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _context(self):
        if self._ctx is None:
            raise ValueError("Llama: this model was closed")
        return self._ctx

    # ---- model facts -----------------------------------------------------------------------
    def n_ctx(self) -> int:
        return self._context().n_ctx

    def n_vocab(self) -> int:
        self._context()
        return self._model.n_vocab

    def n_embd(self) -> int:
        self._context()
        return self._model.n_embd

    def pooling_type(self) -> int:
        """The embeddings' pooling (0 none, 1 mean, 2 cls, 3 last, 4 rank); -1 without embedding=True."""
        return self._pooling

    def token_bos(self) -> int:
        self._context()
        return self._tok.bos

    def token_eos(self) -> int:
        self._context()
        return self._tok.eos

    @property
    def n_tokens(self) -> int:
        """How many tokens the context holds."""
        return len(self._history)

    @property
    def input_ids(self) -> np.ndarray:
        return np.asarray(self._history, dtype=np.int32)

    @property
    def scores(self) -> np.ndarray:
        """The logits rows of the context's tokens, [n_tokens, n_vocab]: every row with
        logits_all=True, else the last row alone (the others NaN), as llama-cpp-python keeps them."""
        n, n_vocab = len(self._history), self.n_vocab()
        if self._logits_all:
            return np.stack(self._rows) if self._rows else np.zeros((0, n_vocab), np.float32)
        out = np.full((n, n_vocab), np.nan, np.float32)
        if n:
            out[n - 1] = self._context().logits()
        return out

    @property
    def eval_logits(self) -> "collections.deque":
        """llama-cpp-python's deque of logits rows (lists): each token's with logits_all=True, else
        the last one's."""
        rows = self._rows if self._logits_all else ([self._context().logits()] if self._history else [])
        return collections.deque((r.tolist() for r in rows), maxlen=self.n_ctx() if self._logits_all else 1)

    # ---- saved states and caches ------------------------------------------------------------
    def save_state(self) -> LlamaState:
        """The context's state (picklable): its tokens, their logits rows, the seed."""
        with self._lock.hold():
            scores = self.scores.copy() if self._history else None
            return LlamaState(input_ids=np.asarray(self._history, dtype=np.int32), scores=scores,
                              n_tokens=len(self._history), seed=self._seed)

    def load_state(self, state: LlamaState) -> None:
        """Makes the context hold state's tokens again (on this or another Llama of the same model):
        the tokens past what the context holds of them already are evaluated."""
        if not isinstance(state, LlamaState):
            raise TypeError(f"load_state: expected a LlamaState (from save_state), got {type(state).__name__}")
        tokens = [int(t) for t in state.input_ids[:state.n_tokens]]
        if any(t < 0 or t >= self.n_vocab() for t in tokens):
            raise ValueError(f"load_state: the state holds token ids outside this model's vocabulary ({self.n_vocab()})"
                             f": it was saved from another model")
        with self._lock.hold():
            self._generation += 1   # a stream running on the old context is abandoned
            self._restore(tokens)
            self._seed = state.seed

    def _restore(self, tokens: List[int]) -> None:
        if tokens:
            self._load_prompt(tokens, logits_all=False)
        else:
            self._context().truncate(0)
            self._history, self._rows = [], []

    def set_cache(self, cache: Optional[BaseLlamaCache]) -> None:
        """llama-cpp-python's prompt cache (LlamaRAMCache, LlamaDiskCache; None: off): each
        completion's state is stored in it, and a prompt starts from the cached state sharing the
        most tokens with it when that is more than the context holds."""
        if cache is not None and not isinstance(cache, BaseLlamaCache):
            raise TypeError(f"set_cache: expected a LlamaRAMCache or LlamaDiskCache, got {type(cache).__name__}")
        self.cache = cache

    def _from_cache(self, prompt_tokens: List[int]) -> None:
        try:
            state = self.cache[prompt_tokens]
        except KeyError:
            return
        def shared(ids):
            n = 0
            for a, b in zip(ids, prompt_tokens[:-1]):
                if a != b:
                    break
                n += 1
            return n
        n = shared([int(t) for t in state.input_ids[:state.n_tokens]])
        if n > shared(self._history):
            self._restore([int(t) for t in state.input_ids[:n]])

    # ---- tokens ----------------------------------------------------------------------------
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> List[int]:
        self._context()
        if isinstance(text, str):
            text = text.encode("utf-8")
        return list(self._tok.encode(text, add_bos, special))

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        self._context()
        return bytes(self._tok.decode(list(tokens), special))

    # ---- evaluation ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forgets the context's tokens (the next prompt is evaluated from scratch)."""
        with self._lock.hold():
            self._context().truncate(0)
            self._history = []
            self._rows = []

    def eval(self, tokens: Sequence[int]) -> None:
        """Appends tokens to the context (ValueError past n_ctx), n_batch at a time. An exception
        (KeyboardInterrupt included) keeps the tokens of the batches already done: the context
        then holds exactly n_tokens / input_ids, and a later prompt sharing them reuses them."""
        tokens = list(tokens)
        with self._lock.hold():
            self._eval(tokens, logits_all=False)

    def _eval(self, tokens: List[int], logits_all: bool) -> Optional[np.ndarray]:
        """Evaluates tokens in n_batch chunks; returns the logits of every token when logits_all.
        One C++ call per chunk, not per prompt, because Python raises KeyboardInterrupt only
        between calls: Ctrl-C then stops a long prompt within one batch."""
        ctx = self._context()
        if len(self._history) + len(tokens) > ctx.n_ctx:
            raise ValueError(f"Requested tokens ({len(self._history) + len(tokens)}) exceed context "
                             f"window of {ctx.n_ctx}")
        rows = []
        every_row = logits_all or self._logits_all
        for start in range(0, len(tokens), self._n_batch):
            chunk = tokens[start:start + self._n_batch]
            try:
                ctx.eval(chunk, every_row)
                self._history.extend(chunk)
            except BaseException:
                ctx.truncate(len(self._history))   # a failed chunk leaves the context as it was before it
                raise
            if every_row:
                rows.append(ctx.all_logits())
                if self._logits_all:
                    self._rows.extend(rows[-1])
        return np.concatenate(rows) if logits_all else None

    def _load_prompt(self, prompt_tokens: List[int], logits_all: bool) -> Optional[np.ndarray]:
        """Makes the context hold exactly prompt_tokens, reusing the longest common prefix of
        what it holds; the last prompt token is always evaluated, to get its logits. Returns
        the logits of every prompt token when logits_all."""
        common = 0
        if not logits_all or self._logits_all:   # with logits_all=True the held rows are reused too
            limit = min(len(self._history), len(prompt_tokens) - 1)
            while common < limit and self._history[common] == prompt_tokens[common]:
                common += 1
        self._context().truncate(common)
        del self._history[common:]
        del self._rows[common:]
        if logits_all and self._logits_all:
            self._eval(prompt_tokens[common:], logits_all=False)
            return np.stack(self._rows[:len(prompt_tokens)])
        return self._eval(prompt_tokens[common:], logits_all)

    # ---- embeddings ------------------------------------------------------------------------
    def embed(self, input: Union[str, List[str]], normalize: bool = True, truncate: bool = True,
              return_count: bool = False):
        """llama-cpp-python's embed: a str gives one embedding (a list of floats), a list of str one
        per string. With pooling none (a decoder GGUF without {arch}.pooling_type, or
        pooling_type=0) an embedding is a list per token; with rank pooling it is [score] (the rank
        head's score of the text, a prompt holding the query and the document). normalize: L2, as
        llama.cpp's embedding output. truncate: a text longer than n_ctx keeps its first n_ctx
        tokens (else ValueError). return_count: also the number of tokens embedded."""
        ctx = self._context()
        if not self._embedding:
            raise RuntimeError("Llama model must be created with embedding=True to call this method")
        texts = [input] if isinstance(input, str) else list(input)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("embed: input must be a str or a list of str")
        n_ctx = ctx.n_ctx
        out, n_tokens, seqs = [], 0, []
        with self._lock.hold():
            # The context is the embedding's scratch: what it held is gone afterwards.
            self._history, self._rows = [], []
            for text in texts:
                tokens = self.tokenize(text.encode("utf-8"), add_bos=True, special=False)
                if not tokens:
                    raise ValueError("embed: the text is empty and the model has no BOS token to embed")
                if truncate:
                    tokens = tokens[:n_ctx]
                elif len(tokens) > n_ctx:
                    raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {n_ctx}")
                if isinstance(ctx, Embedder):
                    seqs.append(tokens)
                else:
                    out.append(embed_tokens(ctx, tokens, self._pooling, normalize).tolist())
                n_tokens += len(tokens)
            if seqs and self._pooling == POOLING_RANK:
                out = [[s] for s in ctx.score_batch(seqs)]
            elif seqs:
                out = [v.tolist() for v in ctx.embed_batch(seqs, normalize)]
        data = out[0] if isinstance(input, str) else out
        return (data, n_tokens) if return_count else data

    def create_embedding(self, input: Union[str, List[str]], model: Optional[str] = None) -> dict:
        """llama-cpp-python's create_embedding: OpenAI's embedding list for a str or a list of
        str, normalized as embed's default."""
        texts = [input] if isinstance(input, str) else list(input)
        embeds, n_tokens = self.embed(texts, return_count=True)
        return {
            "object": "list",
            "data": [{"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(embeds)],
            "model": model if model is not None else self.model_path,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    # ---- completion ------------------------------------------------------------------------
    @staticmethod
    def _check_seed(seed) -> int:
        if seed is None or seed == -1:
            return DEFAULT_SEED
        if not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= 1 << 64:
            raise ValueError(f"seed must be an integer in [0, 2**64) or -1 for random, got {seed!r}")
        return int(seed)

    def create_completion(self, prompt: Union[str, List[int]], suffix: Optional[str] = None,
                          max_tokens: Optional[int] = 16, temperature: float = 0.8, top_p: float = 0.95,
                          min_p: float = 0.05, typical_p: float = 1.0, echo: bool = False,
                          stop: Optional[Union[str, List[str]]] = None, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, repeat_penalty: float = 1.0, top_k: int = 40,
                          stream: bool = False, seed: Optional[int] = None, logprobs: Optional[int] = None,
                          logit_bias: Optional[Dict[int, float]] = None, model: Optional[str] = None,
                          mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                          grammar: Optional[LlamaGrammar] = None):
        """Generates text from a prompt (str or token ids). Returns llama-cpp-python's completion
        dict, or an iterator of its chunk dicts when stream=True. mirostat_mode 1 or 2 samples by
        mirostat (target surprise mirostat_tau, learning rate mirostat_eta) after the penalties
        and the temperature, instead of top_k / typical_p / top_p / min_p. grammar (a LlamaGrammar)
        constrains the text: only tokens it allows are drawn, and it ends where the grammar does."""
        ctx = self._context()
        if self._embedding:
            raise RuntimeError("Llama: this model was created with embedding=True, which computes embeddings "
                               "instead of logits; create another Llama without it to generate text")
        if logprobs is not None and int(logprobs) < 0:
            raise ValueError(f"logprobs must be None or >= 0, got {logprobs}")
        prompt_tokens = encode_prompt(self._tok, prompt)
        prompt_text = prompt if isinstance(prompt, str) else \
            self.detokenize(prompt_tokens).decode("utf-8", errors="ignore")
        n_ctx = ctx.n_ctx
        if len(prompt_tokens) + 1 > n_ctx:
            n = len(prompt_tokens)
            bos = " (BOS included)" if prompt_tokens[0] == self._tok.bos else ""
            raise ValueError(f"the prompt is {n} token{'s' if n != 1 else ''}{bos} and n_ctx is {n_ctx}: a completion "
                             f"needs room for the prompt plus one generated token, so n_ctx must be at least {n + 1}")
        room = n_ctx - len(prompt_tokens)
        max_tokens = room if max_tokens is None or max_tokens <= 0 else min(max_tokens, room)
        if stop is None:
            stops: List[str] = []
        elif isinstance(stop, str):
            stops = [stop] if stop else []
        else:
            stops = [s for s in stop if s]
        seed = self._check_seed(seed) if seed is not None else self._seed
        sampler = _ember.Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                                 presence_penalty=presence_penalty, penalty_last_n=self._last_n,
                                 logit_bias={int(k): float(v) for k, v in (logit_bias or {}).items()},
                                 seed=seed, typical_p=typical_p, mirostat=mirostat_mode, mirostat_tau=mirostat_tau,
                                 mirostat_eta=mirostat_eta)
        matcher = self._grammar_matcher(grammar)
        gen = _Generation(
            id=f"cmpl-{uuid.uuid4()}", created=int(time.time()), model=model or self.model_path,
            prompt_tokens=prompt_tokens, prompt_text=prompt_text, max_tokens=max_tokens, stops=stops,
            sampler=sampler, n_logprobs=None if logprobs is None else int(logprobs), echo=echo,
            suffix=suffix, special=_KEEP_SPECIAL.get(), matcher=matcher)
        if stream:
            return self._stream(gen)
        # The non-streamed result is the streamed pieces joined, so the two always agree.
        text_parts = []
        logprobs_all = empty_completion_logprobs() if gen.n_logprobs is not None else None
        try:
            with self._lock.hold(gen, start=True):
                for piece, lp in self._run(gen):
                    text_parts.append(piece)
                    if lp is not None:
                        for key, values in lp.items():
                            logprobs_all[key].extend(values)
        finally:
            self._lock.end(gen)
        return self._completion_dict(gen, "".join(text_parts), logprobs_all)

    __call__ = create_completion

    def _grammar_matcher(self, grammar):
        """A fresh state of grammar (a LlamaGrammar or StructuredOutputsParams), compiled against
        this model's vocabulary once per grammar; None for none."""
        if grammar is None:
            return None
        if not isinstance(grammar, (LlamaGrammar, StructuredOutputsParams)):
            raise TypeError(f"grammar must be a LlamaGrammar (LlamaGrammar.from_string / from_json_schema), "
                            f"got {type(grammar).__name__}")
        kind, text = grammar.grammar_spec()
        if self._grammars is None:   # two threads racing here build equal compilers
            self._grammars = _ember.GrammarCompiler(self._tok)
        return self._grammars.compile(kind, text).matcher()

    def create_chat_completion(self, messages: List[dict], tools: Optional[List[dict]] = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               min_p: float = 0.05, typical_p: float = 1.0, stream: bool = False,
                               stop: Optional[Union[str, List[str]]] = None, seed: Optional[int] = None,
                               max_tokens: Optional[int] = None, presence_penalty: float = 0.0,
                               frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
                               model: Optional[str] = None, logit_bias: Optional[Dict[int, float]] = None,
                               logprobs: Optional[bool] = None, top_logprobs: Optional[int] = None,
                               mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                               chat_template_kwargs: Optional[dict] = None, response_format: Optional[dict] = None,
                               grammar: Optional[LlamaGrammar] = None, thinking_token_budget: Optional[int] = None):
        """llama-cpp-python's create_chat_completion: the messages rendered by the GGUF's chat
        template, or chat_format's when the Llama was made with one (as ember-server renders them;
        tools and chat_template_kwargs, such as enable_thinking, are passed to it), then
        create_completion.
        Returns a chat.completion dict, or an iterator of chat.completion.chunk dicts when
        stream=True. max_tokens None: until the end of generation or a full context. A reasoning
        model's reply is split as the template spells its thinking (`<think>` tags, gpt-oss's
        channels): content is the answer, reasoning_content (as llama-server names it) the thinking.
        response_format: {"type": "json_object"} (with llama-cpp-python's "schema" key: that schema)
        or {"type": "json_schema", "json_schema": {"name", "schema"}} constrains the reply to JSON,
        as grammar (a LlamaGrammar) does to a grammar; a reasoning model's answer, after its thinking.
        thinking_token_budget: tokens a reply may think before its thinking is closed for it (None:
        no limit)."""
        self._context()   # after close(): the ValueError every method raises
        structured = response_format_params(response_format)
        if structured is not None:
            if grammar is not None:
                raise ValueError("create_chat_completion: give response_format or grammar, not both")
            grammar = LlamaGrammar(structured)
        if self._chat_template is None:   # two threads racing here build the same template
            source = chat_format_template(self._chat_format) if self._chat_format else None
            self._chat_template = ChatTemplate.for_model(self.model_path, self._tok, source=source)
        prompt = self._chat_template.render(messages, tools=tools, **(chat_template_kwargs or {}))
        tokens = self.tokenize(prompt, add_bos=self._chat_template.add_bos(prompt), special=True)
        reasoning = ReasoningParser.for_template(self._chat_template.source)
        if thinking_token_budget is not None and (not isinstance(thinking_token_budget, int)
                                                  or thinking_token_budget < 0):
            raise ValueError(f"thinking_token_budget must be an integer >= 0 (or None), got {thinking_token_budget!r}")
        if reasoning.active:
            params = grammar.params if grammar is not None else None
            composed = after_thinking(params, reasoning, prompt, thinking_token_budget, spelling(self._tok))
            if composed is not params:
                grammar = LlamaGrammar(composed)
        keep_special = _KEEP_SPECIAL.set(reasoning.keeps_special)
        try:
            result = self.create_completion(
                tokens, max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
                typical_p=typical_p, stop=stop, frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty, repeat_penalty=repeat_penalty, top_k=top_k, stream=stream,
                seed=seed, logprobs=(top_logprobs or 0) if logprobs else None, logit_bias=logit_bias, model=model,
                mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, grammar=grammar)
        finally:
            _KEEP_SPECIAL.reset(keep_special)
        reasoning = reasoning if reasoning.active else None
        return chat_chunks(result, reasoning, prompt) if stream else chat_completion(result, reasoning, prompt)

    def _prompt_logprobs(self, gen: _Generation, all_logits: np.ndarray) -> dict:
        """Echo + logprobs: an entry per prompt token (a leading BOS left out); the first entry has
        no logprob, as in the OpenAI API. all_logits: [n_prompt, n_vocab], every prompt position."""
        tokens = gen.prompt_tokens
        detok = Detokenizer(self._tok)
        out = empty_completion_logprobs()
        for i, t in enumerate(tokens):
            offset = detok.push(t)
            if not (i == 0 and t == self._tok.bos):
                out["tokens"].append(piece_text(self._tok, t))
                out["text_offset"].append(offset)
                if not out["token_logprobs"]:
                    out["token_logprobs"].append(None)
                    out["top_logprobs"].append(None)
                else:
                    e = completion_logprob_entry(self._tok, log_softmax(all_logits[i - 1]), t, gen.n_logprobs)
                    out["token_logprobs"].append(e["logprob"])
                    out["top_logprobs"].append(e["top"])
        return out

    def _run(self, gen: _Generation) -> Iterator[tuple]:
        """Generates; yields (text piece, logprobs dict or None) as text becomes safe to show
        (never part of a stop string, never a split UTF-8 character). Sets gen.finish_reason.
        Runs holding self._lock for gen."""
        self._generation += 1
        gen.generation = self._generation
        want_lp = gen.n_logprobs is not None
        if self.cache is not None:
            self._from_cache(gen.prompt_tokens)
        prompt_logits = self._load_prompt(gen.prompt_tokens, logits_all=gen.echo and want_lp)
        base = len(gen.prompt_text)
        if gen.echo:
            yield gen.prompt_text, (self._prompt_logprobs(gen, prompt_logits) if want_lp else None)
        ctx = self._context()
        detok = Detokenizer(self._tok, gen.stops, special=gen.special)
        emitted = 0       # chars of detok.text already yielded
        reported = 0      # completion tokens whose logprobs were already yielded

        def take(end: int, everything: bool = False):
            # A token's logprobs go out with the piece that holds the start of its text.
            nonlocal emitted, reported
            lp = None
            if want_lp:
                lp = empty_completion_logprobs()
                while reported < len(gen.records) and (everything or gen.records[reported][0] < end):
                    start, e = gen.records[reported]
                    lp["tokens"].append(e["token"])
                    lp["text_offset"].append(base + start)
                    lp["token_logprobs"].append(e["logprob"])
                    lp["top_logprobs"].append(e["top"])
                    reported += 1
            piece = detok.text[emitted:end]
            emitted = end
            return piece, lp

        while len(gen.completion_tokens) < gen.max_tokens:
            if self._generation != gen.generation:
                raise RuntimeError("Llama: this stream was abandoned: another completion has started since")
            logits = ctx.logits()
            token = gen.sampler.sample(logits, self._history, gen.matcher)
            if self._tok.is_eog(token):
                gen.finish_reason = "stop"
                break
            if gen.matcher is not None and not gen.matcher.advance(token):
                raise RuntimeError(f"Llama: {gen.matcher.error}")
            gen.completion_tokens.append(token)
            start = detok.push(token)
            if want_lp:
                gen.records.append((start, completion_logprob_entry(self._tok, log_softmax(logits), token,
                                                                    gen.n_logprobs)))
            if detok.stopped:
                break
            end = detok.visible_end()
            if end > emitted:
                yield take(end)
            if len(gen.completion_tokens) >= gen.max_tokens:
                break
            if gen.matcher is not None and gen.matcher.stopped:   # nothing can follow but the end
                gen.finish_reason = "stop"
                break
            self._eval([token], logits_all=False)
        # Finished by length or end of generation: what the detokenizer held back may still
        # complete a stop string.
        detok.flush()
        if detok.stopped:
            gen.finish_reason = "stop"
        if len(detok.text) > emitted or (want_lp and reported < len(gen.records)):
            yield take(len(detok.text), everything=not detok.stopped)
        if self.cache is not None:
            self.cache[self._history] = self.save_state()
        if gen.suffix:
            yield gen.suffix, None

    def _stream(self, gen: _Generation) -> Iterator[dict]:
        """The chunks of _run; each step holds self._lock, and gen's claim on the context lasts
        until _run ends or this generator is closed."""
        run = self._run(gen)
        start = True
        try:
            while True:
                with self._lock.hold(gen, start=start):
                    item = next(run, None)
                start = False
                if item is None:
                    break
                piece, lp = item
                yield {"id": gen.id, "object": "text_completion", "created": gen.created, "model": gen.model,
                       "choices": [{"text": piece, "index": 0, "logprobs": lp, "finish_reason": None}]}
        finally:
            self._lock.end(gen)
        yield {"id": gen.id, "object": "text_completion", "created": gen.created, "model": gen.model,
               "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": gen.finish_reason}]}

    def _completion_dict(self, gen: _Generation, text: str, logprobs: Optional[dict]) -> dict:
        n_prompt, n_completion = len(gen.prompt_tokens), len(gen.completion_tokens)
        return {
            "id": gen.id, "object": "text_completion", "created": gen.created, "model": gen.model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": gen.finish_reason}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                      "total_tokens": n_prompt + n_completion},
        }
