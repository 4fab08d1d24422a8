"""Encoder throughput on the CPU, ember.Encoder against llama.cpp's llama-embedding on the same GGUF
and the same sentences (tools/encoder_vs_transformers.py's generator), runs interleaved A/B and the
median reported. Each side's time is its whole job: llama-embedding's process (load, tokenize,
embed, print to /dev/null), ember's load, tokenization and encode in this process.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python:tools python tools/bench_encoder_cpu.py \
        --llama-embedding /path/to/llama-embedding MODEL.gguf [--n 1000] [--repeats 3] [--threads 2]"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

from encoder_vs_transformers import sentences

from ember import _ember


def run_ember(path, texts, threads, n_batch):
    t0 = time.perf_counter()
    m = _ember.Model(path)
    ids = [list(m.tokenizer.encode(t, add_bos=True)) for t in texts]
    _ember.Encoder(m, n_threads=threads, n_batch=n_batch).encode(ids)
    return time.perf_counter() - t0


def run_llama(binary, path, text_file, threads, n_batch):
    t0 = time.perf_counter()
    subprocess.run([binary, "-m", path, "-f", text_file, "-t", str(threads), "-b", str(n_batch), "-ub", str(n_batch),
                    "-c", str(n_batch), "--embd-normalize", "-1"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-embedding", required=True)
    parser.add_argument("model")
    parser.add_argument("--n", type=int, default=1000, help="sentences")
    parser.add_argument("--repeats", type=int, default=3, help="A/B pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-batch", type=int, default=4096, help="tokens per forward, both sides")
    a = parser.parse_args(argv)
    texts = sentences(a.n, seed=3)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts))
    try:
        ours, theirs = [], []
        for _ in range(a.repeats):
            theirs.append(run_llama(a.llama_embedding, a.model, f.name, a.threads, a.n_batch))
            ours.append(run_ember(a.model, texts, a.threads, a.n_batch))
    finally:
        os.unlink(f.name)
    e, l = statistics.median(ours), statistics.median(theirs)
    print(f"{os.path.basename(a.model)}: {a.n} sentences, {a.threads} threads, n_batch {a.n_batch}, "
          f"{a.repeats} A/B pairs")
    print(f"  ember.Encoder    median {e:.2f} s  {a.n / e:.1f} sentences/s  runs {[round(t, 2) for t in ours]}")
    print(f"  llama-embedding  median {l:.2f} s  {a.n / l:.1f} sentences/s  runs {[round(t, 2) for t in theirs]}")
    print(f"  ember / llama-embedding: {l / e:.2f}x")


if __name__ == "__main__":
    main()
