#!/usr/bin/env python3
"""The cost of constrained decoding in the engine (issue 40): decode tokens/s of B sequences, each
with a JSON schema of its own (tests/structured_schemas.py's, as array items so no grammar ends
within -ntg tokens), against the same B sequences unconstrained (sampled, and greedy, which takes
the engine's argmax path); and the time to first token of a request whose schema is new (compiled
in add_request) against one whose schema is cached.

    python tools/bench_structured.py MODEL.gguf -B 8 -ntg 128 [-t THREADS] [--n-gpu-layers 99]

Tokens/s as ember-bench's batched mode counts them: B * (ntg - 1) over the time from the last
request's first token to the end."""
import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from structured_schemas import schemas  # noqa: E402

from ember import _ember  # noqa: E402
from ember.structured import StructuredOutputsParams, llguidance  # noqa: E402


def spec(schema):
    return StructuredOutputsParams(json={"type": "array", "items": schema, "minItems": 400}).grammar_spec()


def run(engine, prompts, ntg, specs=None, temperature=1.0):
    """(seconds to the last first token, decode seconds after it)."""
    t0 = time.perf_counter()
    ids = []
    for i, p in enumerate(prompts):
        kind, text = specs[i] if specs else ("", "")
        ids.append(engine.add_request(p, temperature=temperature, seed=i + 1, max_tokens=ntg, min_tokens=ntg,
                                      ignore_eos=True, grammar_kind=kind, grammar=text))
    first, left, counts = {}, set(ids), dict.fromkeys(ids, 0)
    while left:
        for o in engine.poll(0.5):
            if o.finish_reason == "error":
                raise RuntimeError(o.error)
            counts[o.request_id] += len(o.token_ids)
            if o.token_ids and o.request_id not in first:
                first[o.request_id] = time.perf_counter()
            if o.finished:
                left.discard(o.request_id)
    t_end = time.perf_counter()
    assert all(c == ntg for c in counts.values()), counts
    t_first = max(first.values())
    return t_first - t0, t_end - t_first


def first_token_seconds(engine, prompt, kind, text):
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, temperature=0.0, max_tokens=1, grammar_kind=kind, grammar=text)
    while True:
        for o in engine.poll(0.5):
            if o.request_id == rid and o.finished:
                return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-npp", type=int, default=32)
    ap.add_argument("-ntg", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2, help="timed runs of each kind (the best is kept)")
    args = ap.parse_args()
    llguidance()
    model = _ember.Model(args.model, _ember.ModelParams(n_gpu_layers=args.n_gpu_layers))
    n_ctx = args.npp + args.ntg + 16
    engine = _ember.Engine(model, n_ctx=n_ctx, max_num_seqs=args.B, n_threads=args.threads,
                           max_num_batched_tokens=max(512, args.B * args.npp),
                           kv_blocks=args.B * -(-n_ctx // 16) + 16)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, model.n_vocab - 100, args.npp).tolist() for _ in range(args.B)]
    all_schemas = schemas(200, seed=40)

    # Compile time of a new schema (the array-wrapped form the decode runs use), then a cached one.
    compiler = _ember.GrammarCompiler(model.tokenizer)
    compile_s = []
    for s in all_schemas:
        kind, text = spec(s)
        t0 = time.perf_counter()
        compiler.compile(kind, text)
        compile_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    compiler.compile(*spec(all_schemas[0]))
    cached_s = time.perf_counter() - t0
    specs = [spec(s) for s in all_schemas[:args.B]]
    run(engine, prompts, 4, specs)   # warm-up; compiles these B grammars into the engine's cache

    new_kind, new_text = spec(schemas(1, seed=999)[0])
    ttft_new = first_token_seconds(engine, prompts[0], new_kind, new_text)
    ttft_cached = first_token_seconds(engine, prompts[0], new_kind, new_text)
    ttft_plain = first_token_seconds(engine, prompts[0], "", "")

    kinds = (("unconstrained greedy", None, 0.0), ("unconstrained sampled", None, 1.0),
             ("json schema sampled", specs, 1.0), ("json schema greedy", specs, 0.0))
    best = {}
    for _ in range(args.reps):   # interleaved, so drift in the machine's load hits every kind alike
        for name, sp, temp in kinds:
            wait0 = engine.stats()["seconds_grammar_wait"]
            _, t_tg = run(engine, prompts, args.ntg, sp, temp)
            wait = engine.stats()["seconds_grammar_wait"] - wait0
            if name not in best or t_tg < best[name][0]:
                best[name] = (t_tg, wait)
    rows = {name: (args.B * (args.ntg - 1) / t, wait) for name, (t, wait) in best.items()}
    engine.close()
    base = rows["unconstrained sampled"][0]
    out = {"model": args.model, "B": args.B, "ntg": args.ntg,
           "compile_ms": {"mean": 1e3 * statistics.mean(compile_s), "median": 1e3 * statistics.median(compile_s),
                          "max": 1e3 * max(compile_s), "cached": 1e3 * cached_s},
           "ttft_ms": {"new_schema": 1e3 * ttft_new, "cached_schema": 1e3 * ttft_cached,
                       "unconstrained": 1e3 * ttft_plain},
           "decode_tok_s": {k: round(v[0], 1) for k, v in rows.items()},
           "grammar_wait_s": {k: round(v[1], 4) for k, v in rows.items()},
           "ratio_vs_sampled": {k: round(v[0] / base, 3) for k, v in rows.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
