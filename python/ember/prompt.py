"""Completion prompts as token ids, the one reading of a prompt that Llama, the engine's front ends
and ember-server share."""
from __future__ import annotations

import numbers
from typing import List


def encode_prompt(tok, prompt) -> List[int]:
    """A completion prompt's token ids: a str is tokenized with BOS (where the model adds one) and
    special tokens, token ids pass as they are; an empty prompt is BOS alone. tok: an
    `_ember.Tokenizer`."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        # llama-cpp-python would read the bytes as token ids (one per byte): garbage, silently.
        raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}; "
                        f"decode it first: prompt.decode('utf-8')")
    if isinstance(prompt, str):
        tokens = list(tok.encode(prompt.encode("utf-8"), True, True))
    else:
        try:
            tokens = list(prompt)
        except TypeError:
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}") from None
        odd = next((t for t in tokens if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if odd is not None:
            raise TypeError(f"prompt token ids must be integers, got {odd!r} ({type(odd).__name__})")
        tokens = [int(t) for t in tokens]
    if not tokens:
        if tok.bos < 0:
            raise ValueError("prompt is empty and the model has no BOS token to start from")
        tokens = [tok.bos]
    return tokens
