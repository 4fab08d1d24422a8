"""Writes tests/reference/fused_families/llama_cpp_greedy.json: llama.cpp's greedy text (llama-simple,
CPU, its default f16 KV cache) on the tiny models of tests/test_arch_fused.py converted by
ember-convert to f32, so that the test checks ember's greedy text against llama.cpp's without
llama.cpp. llama.cpp turns Phi-3's sliding window off, so these files are converted without one;
llama-simple's context (the prompt plus the tokens asked for, padded to 256) passes the tiny model's
original 32 positions, so llama.cpp rotates with LongRoPE's long factors; the short case raises the
original context to 512 so that it takes the short ones.

    PYTHONPATH=python:tests EMBER_DEV_BUILD=build/dev python tools/gen_fused_greedy_references.py \\
        --llama-simple /path/to/llama.cpp/build/bin/llama-simple"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hf_tiny  # noqa: E402

OUT = ROOT / "tests" / "reference" / "fused_families" / "llama_cpp_greedy.json"
# name -> (tiny model, config changes, prompt, tokens to generate)
CASES = {
    "phi3-long": ("phi3", {"sliding_window": None},
                  "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see", 24),
    "phi3-short": ("phi3", {"sliding_window": None, "original_max_position_embeddings": 512,
                            "max_position_embeddings": 2048}, "The quick brown fox", 12),
    "mistral3": ("ministral3", {}, "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see", 24),
    "glm4": ("glm4", {}, "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see", 24),
    "command-r": ("command-r", {}, "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see", 24),
    "cohere2": ("cohere2", {}, "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see", 24),
}


def build(name, work):
    """The case's HF directory (its tiny model with the config changes) and its converted f32 GGUF."""
    from ember.convert import convert

    model, changes, _, _ = CASES[name]
    hf_dir, path = pathlib.Path(work, name), pathlib.Path(work, f"{name}.gguf")
    hf_tiny.build(model, str(hf_dir))
    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    # A name without "phi": llama.cpp gives phi-3 files' "</s>" token attributes this vocabulary lacks.
    convert(str(hf_dir), str(path), "f32", name="tiny-random", progress=False)
    return path


def greedy_bytes(llama_simple, path, prompt, n_predict):
    """The bytes of the pieces llama-simple generates after echoing the prompt."""
    out = subprocess.run([llama_simple, "-m", str(path), "-n", str(n_predict), prompt], capture_output=True,
                         check=True).stdout
    head, sep, text = out.partition(prompt.encode("utf-8"))
    if not sep or not text.endswith(b"\n"):
        raise RuntimeError(f"llama-simple's output is not the prompt, the pieces and a newline: {out!r}")
    return text[:-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-simple", required=True, help="llama.cpp's llama-simple binary")
    args = parser.parse_args(argv)
    refs = {}
    with tempfile.TemporaryDirectory() as work:
        for name, (_, _, prompt, n_predict) in CASES.items():
            text = greedy_bytes(args.llama_simple, build(name, work), prompt, n_predict)
            refs[name] = {"prompt": prompt, "n_predict": n_predict, "text_hex": text.hex()}
            print(name, text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(refs, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
