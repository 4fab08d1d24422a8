"""ember-perplexity: perplexity of a model on a text file, computed as llama.cpp's llama-perplexity does.

The text is tokenized whole and cut into floor(n_tokens / n_ctx) chunks of n_ctx tokens; each chunk is
evaluated from an empty cache (its first token replaced by BOS only where the model adds BOS), and the
logits at positions n_ctx/2 .. n_ctx-2 score the token that follows. PPL = exp(mean NLL).

--kl-divergence-base FILE saves the scored positions' log-probabilities (llama-perplexity's file layout,
kl_divergence.py); with --kl-divergence the model is compared with the one that wrote FILE on FILE's
tokens: KL divergence, top-token agreement, the probability of each next token, as llama-perplexity
prints them.
"""
import argparse
import math
import sys
import time
from typing import Optional

import numpy as np

from . import _ember, kl_divergence, options
from .cli import run_tool
from .version import add_version


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under a row of logits (stable log-softmax)."""
    logits = logits.astype(np.float64)
    peak = logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(logits - peak).sum(axis=1)) + peak[:, 0]
    return log_z - logits[np.arange(len(targets)), targets]


def text_chunks(model, text: bytes, n_ctx: int, max_chunks: int = 0) -> tuple:
    """The text's tokens cut into whole chunks of n_ctx, each starting with BOS where the model
    adds BOS, as llama-perplexity scores them (the first max_chunks of them when > 0, as its
    --chunks); and the text's token count."""
    tok = model.tokenizer
    tokens = tok.encode(text, True, False)
    n_chunk = len(tokens) // n_ctx
    if max_chunks > 0:
        n_chunk = min(n_chunk, max_chunks)
    if n_chunk == 0:
        raise ValueError(f"the text has {len(tokens)} tokens, fewer than n_ctx {n_ctx}: need at least one chunk")
    chunks = []
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if tok.add_bos:
            chunk[0] = tok.bos
        chunks.append(chunk)
    return chunks, len(tokens)


def _kv_fields(kv_type) -> dict:
    """type_k and type_v, both kv_type; nothing (the structs' default) without one."""
    return {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}


def perplexity(model, text: bytes, n_ctx: int, n_threads: int, n_batch: int = 0, out=sys.stdout,
               kv_type: Optional[str] = None, max_chunks: int = 0, base_file: Optional[str] = None,
               **context_fields):
    """The text's perplexity (printed to out as llama-perplexity prints it) over its first
    max_chunks chunks (0: all); context_fields are ContextParams fields (offload_kqv,
    kv_gpu_cache_mb, ...). base_file: the scored positions' log-probabilities are saved there
    (--kl-divergence-base)."""
    chunks, n_tokens = text_chunks(model, text, n_ctx, max_chunks)
    n_chunk = len(chunks)
    ctx = _ember.Context(model, n_ctx=n_ctx, n_batch=n_batch or n_ctx, n_threads=n_threads,
                         **_kv_fields(kv_type), **context_fields)
    first = n_ctx // 2
    nlls = []
    print(f"perplexity: {n_tokens} tokens, {n_chunk} chunks of {n_ctx}", file=out)
    saver = None
    if base_file:
        tokens = model.tokenizer.encode(text, True, False)[:n_chunk * n_ctx]
        saver = kl_divergence.BaseWriter(base_file, n_ctx, model.n_vocab, n_chunk, tokens)
        print(f"perplexity: saving the log-probabilities to {base_file}", file=out)
    start = time.perf_counter()
    for c, chunk in enumerate(chunks):
        ctx.truncate(0)
        ctx.eval(chunk, logits_all=True)
        logits = ctx.all_logits()
        targets = np.asarray(chunk[first + 1:], dtype=np.int64)
        nlls.append(chunk_nll(logits[first:n_ctx - 1], targets))
        if saver:
            saver.write_chunk(logits[first:n_ctx - 1])
        running = math.exp(np.concatenate(nlls).mean())
        print(f"[{c + 1}]{running:.4f},", end="", file=out, flush=True)
    print(file=out)
    if saver:
        saver.close()
    nll = np.concatenate(nlls)
    ppl = math.exp(nll.mean())
    # Error estimate as llama.cpp reports it: the standard error of the mean NLL, propagated through exp.
    err = ppl * nll.std(ddof=1) / math.sqrt(len(nll)) if len(nll) > 1 else 0.0
    elapsed = time.perf_counter() - start
    print(f"{n_chunk * n_ctx / elapsed:.1f} tokens/s", file=out)
    print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}", file=out)
    return ppl


def perplexity_engine(model, text: bytes, n_ctx: int, n_threads: int, kv_type: Optional[str] = None,
                      parallel: int = 8, deterministic: bool = True) -> float:
    """perplexity() through the continuous-batching engine: every chunk is a request of its own
    (up to `parallel` at once) whose prompt logprobs score the same positions. Deterministic mode
    (the default) gives each chunk the logits it gets alone, so the figure equals perplexity()'s."""
    chunks, _ = text_chunks(model, text, n_ctx)
    engine = _ember.Engine(model, n_ctx=n_ctx, max_num_seqs=parallel, max_num_batched_tokens=max(512, n_ctx),
                           n_threads=n_threads, enable_prefix_caching=False, deterministic=deterministic,
                           **_kv_fields(kv_type))
    try:
        ids = [engine.add_request(chunk, max_tokens=0, prompt_logprobs=True) for chunk in chunks]
        scores, left = {}, set(ids)
        while left:
            for o in engine.poll(1.0):
                if o.prompt_logprobs:
                    scores[o.request_id] = list(o.prompt_logprobs)
                if o.finished:
                    if o.finish_reason == "error":
                        raise RuntimeError(f"chunk request {o.request_id} failed: {o.error}")
                    left.discard(o.request_id)
    finally:
        engine.close()
    # prompt_logprobs[p] scores token p + 1, as perplexity()'s logits row p does.
    first = n_ctx // 2
    nll = -np.concatenate([np.asarray(scores[i][first:n_ctx - 1], dtype=np.float64) for i in ids])
    return math.exp(nll.mean())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ember-perplexity", description=__doc__.splitlines()[0])
    ap.add_argument("-f", "--file",
                    help="text file to score (not with --kl-divergence: the base file holds the tokens)")
    ap.add_argument("--chunks", type=int, default=-1, metavar="N",
                    help="score the first N chunks only (default: -1, every whole chunk of the file)")
    ap.add_argument("--kl-divergence-base", metavar="FILE",
                    help="save the scored positions' log-probabilities to FILE (with --kl-divergence: read them)")
    ap.add_argument("--kl-divergence", action="store_true",
                    help="compare the model with the one whose log-probabilities --kl-divergence-base names")
    options.add_arguments(ap, options.PERPLEXITY)
    add_version(ap)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return run_tool("ember-perplexity", lambda: _run(args))


def _run(args) -> int:
    if args.chunks == 0 or args.chunks < -1:
        raise ValueError(f"--chunks must be a number of chunks >= 1 (or -1: all), got {args.chunks}")
    if args.kl_divergence and not args.kl_divergence_base:
        raise ValueError("--kl-divergence needs --kl-divergence-base FILE: the base model's log-probabilities")
    if args.kl_divergence and args.file:
        raise ValueError("--kl-divergence scores the tokens the base file holds: give no -f/--file")
    if not args.kl_divergence and not args.file:
        raise ValueError("-f/--file is required: the text to score")
    kv_type = options.kv_cache_type(args.type_k, args.type_v)
    context = dict(kv_type=kv_type, offload_kqv=args.offload_kqv, kv_gpu_cache_mb=args.kv_gpu_cache_mb)
    if args.kl_divergence:
        base = kl_divergence.read_base(args.kl_divergence_base)
        model = _ember.Model(args.model, options.fill(_ember.ModelParams(), vars(args)))
        kl_divergence.compare(model, base, args.n_threads or 0, args.n_batch or 0,
                              max_chunks=max(args.chunks, 0), **context)
        return 0
    with open(args.file, "rb") as f:
        text = f.read()
    model = _ember.Model(args.model, options.fill(_ember.ModelParams(), vars(args)))
    n_ctx = options.context_size(model, args.n_ctx)
    perplexity(model, text, n_ctx, args.n_threads or 0, args.n_batch or 0, max_chunks=max(args.chunks, 0),
               base_file=args.kl_divergence_base, **context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
