"""llama.cpp's llama-embedding against ember.Encoder on the same GGUF files and texts: every token's
hidden state (--pooling none) and the file's pooling (rank: the classifier's score), with the
largest difference and the cosine of each text's vectors.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python python tools/encoder_vs_llamacpp.py \
        --llama-embedding /path/to/llama-embedding model.gguf [...]

llama.cpp computes BERT's GELU in its tanh form and adds token type 0 everywhere; ember computes
the exact (erf) GELU, as transformers does, so the two differ by that much on BERT files."""
import argparse
import json
import subprocess

import numpy as np

from ember import _ember

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Numbers: 0 1 12 123 and a few words",
         "short"]
_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def llama_embedding(binary, path, text, pooling, tries=20):
    """llama-embedding prints its JSON through its asynchronous logger, which at exit sometimes drops
    the tail of it: runs are repeated until the output parses."""
    for _ in range(tries):
        out = subprocess.run([binary, "-m", path, "-p", text, "--pooling", _NAMES[pooling], "--embd-normalize", "-1",
                              "--embd-output-format", "json", "-t", "2"], capture_output=True, text=True, check=True)
        try:
            data = json.loads(out.stdout)["data"]
        except ValueError:
            continue
        return np.array([d["embedding"] for d in data], dtype=np.float64)
    raise RuntimeError(f"{binary}: no complete JSON output in {tries} runs")


def compare(binary, path):
    m = _ember.Model(path)
    rows = []
    for pooling in (0, None):
        enc = _ember.Encoder(m, n_threads=2, **({} if pooling is None else {"pooling": pooling}))
        for text in TEXTS:
            # The tiny models' byte-level BPE vocabulary adds no BOS, as llama.cpp reads the file.
            ids = list(m.tokenizer.encode(text, add_bos=False))
            ours = enc.encode([ids])
            ours = np.asarray(ours[0] if enc.pooling == 0 else ours, np.float64)
            theirs = llama_embedding(binary, path, text, enc.pooling)
            if enc.pooling == 4:   # llama-embedding prints a rank score as the first of n_embd values
                theirs = theirs[:, :enc.n_out]
            theirs = theirs.reshape(ours.shape)
            a, b = ours.ravel(), theirs.ravel()
            rows.append((_NAMES[enc.pooling], text[:24], float(np.abs(a - b).max()),
                         float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-embedding", required=True, help="llama.cpp's llama-embedding binary")
    parser.add_argument("models", nargs="+", help="GGUF files of encoder models")
    args = parser.parse_args(argv)
    for path in args.models:
        for pooling, text, diff, cos in compare(args.llama_embedding, path):
            print(f"{path}\t{pooling}\t{text!r}\tmax|diff| {diff:.2e}\tcosine {cos:.7f}")


if __name__ == "__main__":
    main()
