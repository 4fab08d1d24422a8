"""Writes tests/reference/llama4/llama_cpp_greedy.json: llama.cpp's greedy text (llama-simple, CPU, its
default f16 KV cache) on tests/test_arch_llama4.py's tiny llama4, converted by ember-convert to f32 with
the keys llama.cpp's llama4 fixes set to its values (chunks of 8192, temperature 0.1 over 8192), so that
the test checks ember's greedy text against llama.cpp's without llama.cpp.

    PYTHONPATH=python:tests EMBER_DEV_BUILD=build/dev python tools/gen_llama4_greedy_reference.py \\
        --llama-simple /path/to/llama.cpp/build/bin/llama-simple"""
import argparse
import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
import hf_tiny  # noqa: E402
from gen_chat_greedy_references import N_PREDICT, PROMPT, greedy_bytes  # noqa: E402
from test_arch_llama4 import LLAMA_CPP_KEYS, _rewritten  # noqa: E402

OUT = ROOT / "tests" / "reference" / "llama4" / "llama_cpp_greedy.json"


def main(argv=None):
    from ember.convert import convert

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-simple", required=True, help="llama.cpp's llama-simple binary")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        hf_dir, path = pathlib.Path(work, "llama4"), pathlib.Path(work, "llama4.gguf")
        hf_tiny.build("llama4", str(hf_dir))
        convert(str(hf_dir), str(path), "f32", progress=False)
        fixed = _rewritten(str(path), str(pathlib.Path(work, "fixed.gguf")), "llama4", **LLAMA_CPP_KEYS)
        text = greedy_bytes(args.llama_simple, fixed)
    refs = {"llama4": {"prompt": PROMPT, "n_predict": N_PREDICT, "text_hex": text.hex()}}
    print(text)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(refs, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
