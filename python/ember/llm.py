"""`LLM`: vLLM's offline batch API over ember's continuous-batching engine (`_ember.Engine`):
load a GGUF model once, generate for many prompts at a time, get RequestOutputs in prompt order."""
from __future__ import annotations

import copy
import itertools
import numbers
import sys
import time
from typing import List, Optional, Sequence, Union

from . import _ember
from .chat.constrain import after_thinking, spelling
from .chat.reasoning import ReasoningParser
from .embedding import is_encoder
from .engine_client import EngineClient
from .pooling import Pooler, PoolingParams, PoolingRequestOutput
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .hf_tokenizer import HFTokenizer
from .options import LLM as _FRONT_END, context_size, fill, resolve, signature
from .engine_args import (check_dtype, check_parallel, engine_args_kwargs, host_tier_mb, kv_mb_for_utilization,
                          kv_types_from_dtype, note_ignored)

__all__ = ["LLM", "engine_args_kwargs"]


def _prompt_list(prompts) -> list:
    """vLLM's prompt forms as a list: a str, a dict, or one list of token ids is one prompt."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    try:
        prompts = list(prompts)
    except TypeError:
        raise TypeError(f"LLM.generate: prompts must be a str, token ids, a prompt dict or a list of those, "
                        f"got {type(prompts).__name__}") from None
    if prompts and isinstance(prompts[0], numbers.Integral):
        return [prompts]
    return prompts


class LLM:
    """A GGUF model served by one continuous-batching engine. Its options (docs/options.md) are
    vLLM's names where vLLM has one: n_ctx is the longest sequence (prompt + generated tokens); the
    KV pool is sized by kv_mb (MiB; 0: the engine's default); kv_host_mb (MiB of host memory; 0:
    none) adds a host tier that preempted sequences are swapped out to and evicted prefix-cache
    blocks are kept in; offload_kqv=False keeps the KV in host memory, with kv_gpu_cache_mb MiB of
    GPU memory caching its blocks; type_k / type_v take what Llama takes (ggml type ids or "f16",
    "f32", "q8_0"); seed makes the requests without a seed of their own reproducible. vLLM's
    spellings model= (for model_path) and max_model_len= (for n_ctx) are taken too, and vLLM's engine
    arguments where ember has their meaning: gpu_memory_utilization (with blocks on the GPU and no
    kv_mb, the KV pool fills that share of the GPU's memory), kv_cache_dtype, swap_space (GiB of
    host tier), dtype (checked against the file), tensor_parallel_size (1) and trust_remote_code
    (ignored, with a note)."""

    def __init__(self, model_path: Optional[str] = None, *, model: Optional[str] = None,
                 max_model_len: Optional[int] = None, **kwargs):
        self._client = None   # set last: close() and __del__ run on a half-built LLM too
        self._pooler: Optional[Pooler] = None
        self._hf_tokenizer: Optional[HFTokenizer] = None
        if (model_path is None) == (model is None):
            raise ValueError("LLM: give the GGUF file once, as model_path or as model= (vLLM's name)")
        n_ctx = kwargs.get("n_ctx")
        if n_ctx is not None and max_model_len is not None and n_ctx != max_model_len:
            raise ValueError(f"LLM: n_ctx={n_ctx} and max_model_len={max_model_len} name the same limit; give one")
        if max_model_len is not None:
            kwargs["n_ctx"] = max_model_len
        o = resolve(_FRONT_END, kwargs)
        check_parallel(o["tensor_parallel_size"])
        note_ignored(kwargs)
        o.update(kv_types_from_dtype(o["kv_cache_dtype"], kwargs))
        o.update(host_tier_mb(o["swap_space"], kwargs))
        self.model_path = str(model_path if model is None else model)
        check_dtype(o["dtype"], _ember.GGUFFile(self.model_path).get_uint("general.file_type", 2**32 - 1))
        t0 = time.perf_counter()
        loaded = _ember.Model(self.model_path, fill(_ember.ModelParams(), o))
        # -nkvo keeps the KV in host memory: the GPU's share says nothing about its size.
        if o["gpu_memory_utilization"] is not None and not o["kv_mb"] and o["offload_kqv"]:
            n_gpu = loaded.n_gpu_layers
            o["kv_mb"] = kv_mb_for_utilization(o["gpu_memory_utilization"], loaded.n_layer if n_gpu < 0 else n_gpu,
                                               loaded.n_layer, o["main_gpu"])
        self._model = loaded   # the loaded weights, which an embedding context may share (ember-server)
        self._pooler = Pooler(loaded, loaded.tokenizer, context_size(loaded, o["n_ctx"]), o["pooling_type"],
                              o["n_threads"] or 0)
        if is_encoder(loaded):   # it embeds and scores; no engine generates with it
            return
        engine = _ember.Engine(loaded, fill(_ember.EngineParams(), o, n_ctx=context_size(loaded, o["n_ctx"])))
        self._ids = itertools.count()
        self._client = EngineClient(engine, loaded.tokenizer, o["seed"])
        if o["verbose"]:
            stats = engine.stats()
            print(f"ember: loaded {self.model_path} (arch {loaded.arch}, {loaded.n_layer} layers, "
                  f"{loaded.n_gpu_layers} GPU layers) with n_ctx {engine.n_ctx}, max_num_seqs {engine.max_num_seqs}, "
                  f"{stats['kv_blocks_total']} KV blocks of {engine.kv_block_size} tokens (K {o['type_k']}, "
                  f"V {o['type_v']}) in {time.perf_counter() - t0:.2f} s", file=sys.stderr)

    __init__.__signature__ = signature(_FRONT_END, __init__)

    def _encoder_only(self) -> bool:
        """An encoder model's LLM, which has no engine."""
        return self._client is None and self._pooler is not None and is_encoder(self._model)

    def _open_client(self) -> EngineClient:
        if self._encoder_only():
            raise ValueError(f"LLM: {self._model.arch} is an encoder model: it embeds and scores (LLM.embed, "
                             f"LLM.score, LLM.encode) and does not generate")
        if self._client is None or self._client.closed:
            raise ValueError("LLM: this model was closed")
        return self._client

    @property
    def model(self):
        """The loaded weights (`_ember.Model`): an embedding context may share them."""
        return self._model

    @property
    def tokenizer(self):
        """The model's `_ember.Tokenizer`."""
        return self._model.tokenizer

    def get_tokenizer(self) -> HFTokenizer:
        """vLLM's: the tokenizer as Hugging Face's API has it (encode, decode, apply_chat_template,
        eos_token_id, ...)."""
        if self._hf_tokenizer is None:
            self._hf_tokenizer = HFTokenizer(self.tokenizer, self.model_path)
        return self._hf_tokenizer

    @property
    def n_ctx(self) -> int:
        """The longest sequence the engine takes, prompt + generated tokens (an encoder's: the longest input)."""
        if self._encoder_only():
            return self._pooler.n_ctx
        return self._open_client().engine.n_ctx

    @property
    def max_num_seqs(self) -> int:
        """Sequences holding KV at once; more requests wait (0 for an encoder, which holds none)."""
        if self._encoder_only():
            return 0
        return self._open_client().engine.max_num_seqs

    def generate(self, prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Generates for every prompt (a str, token ids, a vLLM prompt dict, or a list of those)
        with sampling_params (one for all, or one per prompt; None: SamplingParams()). Returns
        the finished RequestOutputs in prompt order. An engine error raises RuntimeError, and
        KeyboardInterrupt passes through; either way every request is cancelled first."""
        client = self._open_client()
        prompts = _prompt_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"sampling_params: {len(sampling_params)} given for {len(prompts)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        states = []
        bar = None
        try:
            for prompt, p in zip(prompts, params):
                states.append(client.submit(str(next(self._ids)), prompt, p))
            if use_tqdm:
                # Imported here: `import ember` does not need tqdm loaded.
                from tqdm import tqdm
                bar = tqdm(total=len(states), desc="Processed prompts", unit="prompt", file=sys.stderr)
            pending = states
            while pending:
                client.pump(0.05)
                still = [s for s in pending if not s.engine_done]
                failed = next((s.error for s in pending if s.error), None)
                if failed is not None:
                    raise RuntimeError(f"ember engine: {failed}")
                if bar is not None:
                    bar.update(len(pending) - len(still))
                pending = still
        except BaseException:
            for state in states:
                client.cancel(state)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [s.output() for s in states]

    def chat(self, messages, sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = True, *, chat_template: Optional[str] = None, add_generation_prompt: bool = True,
             chat_template_kwargs: Optional[dict] = None, tools=None,
             thinking_token_budget: Optional[int] = None) -> List[RequestOutput]:
        """vLLM's LLM.chat: messages is one conversation (a list of {"role", "content"} dicts) or a
        list of them. Each is rendered by the model's chat template (chat_template: Jinja text to
        use instead), tokenized with its special tokens, and generated as by generate(). Returns one
        RequestOutput per conversation, whose prompt is the rendered text. A template that refuses
        the messages raises ValueError before anything is submitted. A reasoning model's replies are
        split as its template spells thinking (`<think>` tags, gpt-oss's channels): each output's
        text is the answer, its reasoning_content the thinking; a structured_outputs constraint
        applies to the answer, after the thinking. thinking_token_budget: tokens a reply may think
        before its thinking is closed for it (None: no limit)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self.get_tokenizer()
        prompts = []
        for conversation in conversations:
            text, ids = tok.render_chat(conversation, tools=tools, chat_template=chat_template,
                                        add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {}))
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        if thinking_token_budget is not None and (not isinstance(thinking_token_budget, int)
                                                  or thinking_token_budget < 0):
            raise ValueError(f"thinking_token_budget must be an integer >= 0 (or None), got {thinking_token_budget!r}")
        reasoning = ReasoningParser.for_template(tok.chat_template if chat_template is None else chat_template)
        if not reasoning.active:
            return self.generate(prompts, sampling_params, use_tqdm)
        spell = spelling(self._model.tokenizer)
        if isinstance(sampling_params, (list, tuple)):
            params = [copy.copy(p) for p in sampling_params]
        else:
            params = [copy.copy(sampling_params or SamplingParams()) for _ in prompts]
        for p, prompt in zip(params, prompts):
            if reasoning.keeps_special:
                p.skip_special_tokens = False   # the thinking's markers are special tokens
            p.structured_outputs = after_thinking(p.structured_outputs, reasoning, prompt["prompt"],
                                                  thinking_token_budget, spell)
        results = self.generate(prompts, params, use_tqdm)
        for result in results:
            for o in result.outputs:
                o.text, o.reasoning_content = reasoning.split(o.text, result.prompt)
        return results

    # ---- pooling (vLLM's embed / score / encode) ---------------------------------------------
    def _pooling(self) -> Pooler:
        if self._pooler is None or (self._client is not None and self._client.closed):
            raise ValueError("LLM: this model was closed")
        return self._pooler

    def embed(self, prompts, *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: bool = True,
              pooling_params: Optional[PoolingParams] = None) -> List[PoolingRequestOutput]:
        """vLLM's LLM.embed: one EmbeddingRequestOutput per prompt (a str, token ids, a prompt dict or a list
        of those) whose outputs.embedding is the pooled vector (the GGUF's pooling, or pooling_type=),
        L2-normalized unless pooling_params.normalize is False; pooling_params.dimensions keeps its first
        values (Matryoshka). Encoders pack the prompts into few forwards."""
        return self._pooling().embed(prompts, pooling_params, truncate_prompt_tokens)

    def score(self, data_1, data_2, *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: bool = True,
              pooling_params: Optional[PoolingParams] = None) -> List[PoolingRequestOutput]:
        """vLLM's LLM.score: data_1 (a text, or texts) against data_2's texts, one ScoringRequestOutput each
        (outputs.score): a reranker's score of the (query, document) pair, or for an embedding model the
        cosine similarity of the two embeddings."""
        return self._pooling().score(data_1, data_2, truncate_prompt_tokens)

    def encode(self, prompts, pooling_params: Optional[PoolingParams] = None, *,
               truncate_prompt_tokens: Optional[int] = None, use_tqdm: bool = True) -> List[PoolingRequestOutput]:
        """vLLM's LLM.encode: the pooler's raw output per prompt (outputs.data, a float32 array: the pooled
        vector, or one row per token with pooling none), not normalized unless pooling_params asks."""
        return self._pooling().encode(prompts, pooling_params, truncate_prompt_tokens)

    def stats(self) -> dict:
        """The engine's counters (running, waiting, kv_blocks_used, prefix_cache_hits, ...); None for an
        encoder, which has no engine."""
        if self._encoder_only():
            return None
        return self._open_client().engine.stats()

    def close(self) -> None:
        """Stops the engine; requests still running end with "abort". Unusable afterwards."""
        # getattr: __del__ also runs on an LLM whose __init__ was never entered (bad arguments).
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()
