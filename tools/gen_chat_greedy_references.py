"""Writes tests/reference/chat_families/llama_cpp_greedy.json: llama.cpp's greedy text (llama-simple,
CPU, its default f16 KV cache) on each chat-family tiny model of tests/test_arch_chat.py, converted
by ember-convert to f32, so that the test checks ember's greedy text against llama.cpp's without
llama.cpp.

    PYTHONPATH=python:tests EMBER_DEV_BUILD=build/dev python tools/gen_chat_greedy_references.py \\
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

OUT = ROOT / "tests" / "reference" / "chat_families" / "llama_cpp_greedy.json"
MODELS = ["gemma2", "olmo2", "olmo3", "granite", "smollm3"]
# Longer than every window of the tiny models (8 tokens) once tokenized.
PROMPT = "The quick brown fox jumps over the lazy dog. She said: it's fine, we'll see"
N_PREDICT = 24


def greedy_bytes(llama_simple, path):
    """The bytes of the pieces llama-simple generates after echoing the prompt (a random model's
    pieces need not be whole UTF-8 characters)."""
    out = subprocess.run([llama_simple, "-m", str(path), "-n", str(N_PREDICT), PROMPT], capture_output=True,
                         check=True).stdout
    head, sep, text = out.partition(PROMPT.encode("utf-8"))
    if not sep or not text.endswith(b"\n"):
        raise RuntimeError(f"llama-simple's output is not the prompt, the pieces and a newline: {out!r}")
    return text[:-1]


def reference_table(llama_simple, models, extra=None):
    """{name: prompt, n_predict, text_hex} of llama-simple on each tiny model converted by ember-convert to
    f32; extra(name, path, text), where given, adds fields to an entry."""
    from ember.convert import convert
    refs = {}
    with tempfile.TemporaryDirectory() as work:
        for name in models:
            hf_dir, path = pathlib.Path(work, name), pathlib.Path(work, f"{name}.gguf")
            hf_tiny.build(name, str(hf_dir))
            convert(str(hf_dir), str(path), "f32", progress=False)
            text = greedy_bytes(llama_simple, path)
            refs[name] = {"prompt": PROMPT, "n_predict": N_PREDICT, "text_hex": text.hex(),
                          **(extra(name, path, text) if extra else {})}
            print(name, text)
    return refs


def write_table(refs, out):
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(refs, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-simple", required=True, help="llama.cpp's llama-simple binary")
    args = parser.parse_args(argv)
    write_table(reference_table(args.llama_simple, MODELS), OUT)


if __name__ == "__main__":
    main()
