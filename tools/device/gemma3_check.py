"""Gemma 3 270M Q4_K_M on the GPU against llama.cpp's reference (tests/reference/gemma3): the checks of
tests/test_gemma3.py with every layer offloaded (or any -ngl): perplexity at n_ctx 1024 within 1% of
llama-perplexity's, greedy text agreeing over 16 tokens on most of the 12 prompts, and where a prompt
parts from llama.cpp's text, the top two logits within noise of each other.

    EMBER_DEV_BUILD=build/cuda PYTHONPATH=python python tools/device/gemma3_check.py [MODEL] [-ngl N]

MODEL defaults to $EMBER_TEST_CACHE/gemma-3-270m-q4_k_m.gguf. The device machine reaches no package
registry: carry the file there in slices and concatenate them; its size and sha256 are checked here.
Exit status 0 when every check passes."""
import argparse
import io
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from gemma3_model import CACHE, GEMMA3_FILE, GEMMA3_SHA256, GEMMA3_SIZE, sha256_of  # noqa: E402
from test_gemma3 import LLAMA_CPP_PPL, MIN_AGREE, PPL_TEXT, TIE_MARGIN, check_greedy  # noqa: E402

from ember import _ember  # noqa: E402
from ember.perplexity import perplexity  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(CACHE / GEMMA3_FILE))
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1)
    ap.add_argument("-t", "--threads", type=int, default=4)
    args = ap.parse_args()

    path = pathlib.Path(args.model)
    size, digest = path.stat().st_size, sha256_of(path)
    if (size, digest) != (GEMMA3_SIZE, GEMMA3_SHA256):
        print(f"{path}: {size} bytes, sha256 {digest}: not the reference model", file=sys.stderr)
        return 2
    model = _ember.Model(str(path), n_gpu_layers=args.n_gpu_layers)
    ok = True

    out = io.StringIO()
    ppl = perplexity(model, PPL_TEXT.read_bytes(), 1024, args.threads, out=out)
    rel = ppl / LLAMA_CPP_PPL - 1
    ok &= abs(rel) < 0.01
    print(f"perplexity -c 1024 (-ngl {args.n_gpu_layers}): ember {ppl:.4f}, llama.cpp {LLAMA_CPP_PPL} "
          f"({rel * 100:+.2f}%) {'ok' if abs(rel) < 0.01 else 'FAIL'}")

    results = check_greedy(model, model.tokenizer, n_threads=args.threads)
    agree = sum(match == want for _, match, want, _ in results)
    for prompt, match, want, parting in results:
        line = f"  {prompt!r}: {match}/{want} tokens agree"
        if parting:
            tie = sum(parting) < TIE_MARGIN
            ok &= tie
            line += (f"; parts where ember prefers its token by {parting[0]:.3f} and llama.cpp its own by "
                     f"{parting[1]:.3f} ({'near tie' if tie else 'NOT a near tie'})")
        print(line)
    ok &= agree >= MIN_AGREE
    print(f"greedy: {agree}/{len(results)} prompts agree over 16 tokens {'ok' if agree >= MIN_AGREE else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
