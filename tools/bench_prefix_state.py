"""Time to first token of a hybrid model's second prompt that shares a long prefix with the first
(Llama, CPU): the recurrent state resumes from the prefix's last snapshot (state_snapshot_interval)
instead of evaluating the whole prompt again, as without snapshots (interval 0, and llama.cpp, which
keeps no prompt cache for recurrent models).

    python tools/bench_prefix_state.py model.gguf --prefix 1500 --suffix 24 --threads 2
"""
import argparse
import statistics
import time

import numpy as np

import ember


def ttft(llm, ids) -> float:
    t0 = time.perf_counter()
    llm.create_completion(ids, max_tokens=1, temperature=0.0)
    return time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prefix", type=int, default=1500)
    parser.add_argument("--suffix", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--interval", type=int, default=128, help="state_snapshot_interval")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    n_ctx = args.prefix + 2 * args.suffix + 8
    rows = []
    for interval in (args.interval, 0):
        llm = ember.Llama(args.model, n_ctx=n_ctx, n_threads=args.threads, verbose=False,
                          state_snapshot_interval=interval)
        n_vocab = llm.n_vocab()
        firsts, seconds = [], []
        for _ in range(args.repeats):
            prefix = [int(x) for x in rng.integers(100, n_vocab - 100, size=args.prefix)]
            a = prefix + [int(x) for x in rng.integers(100, n_vocab - 100, size=args.suffix)]
            b = prefix + [int(x) for x in rng.integers(100, n_vocab - 100, size=args.suffix)]
            firsts.append(ttft(llm, a))
            seconds.append(ttft(llm, b))
        first, second = statistics.median(firsts), statistics.median(seconds)
        rows.append((interval, first, second))
        llm.close()
    print(f"prefix {args.prefix}, suffix {args.suffix}, {args.threads} threads, medians of {args.repeats}")
    print("| state_snapshot_interval | first prompt TTFT (s) | second prompt TTFT (s) | second / first |")
    print("|---|---|---|---|")
    for interval, first, second in rows:
        print(f"| {interval} | {first:.3f} | {second:.3f} | {second / first:.3f} |")


if __name__ == "__main__":
    main()
