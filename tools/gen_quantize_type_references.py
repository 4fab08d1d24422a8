"""Writes tests/reference/quantize_types.json: the type llama-quantize gives each tensor of the tiny hybrid, MoE and
MLA models (tests/hf_tiny.py, converted to f16 by ember-convert) under a few mixes, so that
tests/test_quantize_arch_rules.py checks ember-quantize's recipe against llama.cpp's without llama.cpp.

    EMBER_DEV_BUILD=build/dev PYTHONPATH=python python tools/gen_quantize_type_references.py LLAMA_QUANTIZE [--out F]

The tiny models' rows are shorter than a K block (256), so K types show as their fallbacks (Q4_K -> Q5_0,
Q6_K -> Q8_0, ...): which rule fired still shows in the type."""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

from gguf import GGUFReader

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import hf_tiny  # noqa: E402

# Hybrid (Mamba2 / gated DeltaNet / short conv), MoE with shared experts and routers, MLA with 8 experts.
MODELS = ("qwen35moe", "qwen3next", "lfm2moe", "nemotron_h", "granitehybrid-moe", "deepseek-v3", "gemma4-moe")
MIXES = ("Q8_0", "Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "MXFP4_MOE")
OUT = ROOT / "tests" / "reference" / "quantize_types.json"


def f16_model(name: str, tmp: pathlib.Path) -> str:
    from ember.convert import convert
    hf_dir, path = tmp / name, tmp / f"{name}.f16.gguf"
    hf_tiny.build(name, str(hf_dir))
    convert(str(hf_dir), str(path), "f16", progress=False)
    return str(path)


def tensor_types(path: str) -> dict:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("llama_quantize", help="path of llama.cpp's llama-quantize")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    table = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        for name in MODELS:
            src = f16_model(name, tmp)
            table[name] = {}
            for mix in MIXES:
                dst = str(tmp / f"{name}.{mix}.gguf")
                subprocess.run([args.llama_quantize, src, dst, mix, "1"], check=True, capture_output=True)
                table[name][mix] = tensor_types(dst)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}: {len(MODELS)} models x {len(MIXES)} mixes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
