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
MIXES = ("Q8_0", "Q4_K_M", "Q3_K_M", "MXFP4_MOE")
# The same models with rows of 256 (test_quantize_arch_rules.widened): the K types themselves, not their fallbacks.
WIDE_MIXES = ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q3_K_L", "Q2_K", "IQ4_XS", "IQ4_NL", "TQ1_0", "TQ2_0")
# (model, mix, --tensor-type patterns, --output-tensor-type): the first matching pattern wins, an overridden attn_qkv
# does not advance attn_v's layer count, routers stay as stored; a tied head's type reaches the embedding.
OVERRIDES = (("qwen35moe", "Q3_K_M", ["blk\\.0\\.attn_qkv=Q4_0", "attn_qkv=Q8_0", "ffn_gate_inp=Q4_0"], ""),
             ("lfm2moe", "Q4_K_M", ["ffn_down_exps=Q4_1", "ffn_down=Q8_0"], "Q5_0"))
OUT = ROOT / "tests" / "reference" / "quantize_types.json"


def f16_model(name: str, tmp: pathlib.Path) -> str:
    from ember.convert import convert
    hf_dir, path = tmp / name, tmp / f"{name}.f16.gguf"
    hf_tiny.build(name, str(hf_dir))
    convert(str(hf_dir), str(path), "f16", progress=False)
    return str(path)


def tensor_types(path: str) -> dict:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def by_mix(types: dict) -> dict:
    """{mix: {tensor: type}} as the tensor names once (sorted) and per mix the types in that order."""
    names = sorted(next(iter(types.values())))
    assert all(sorted(t) == names for t in types.values())
    return {"tensors": names, "types": {mix: [t[n] for n in names] for mix, t in types.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("llama_quantize", help="path of llama.cpp's llama-quantize")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    import numpy as np
    from quantize_wide import widened
    table = {"mixes": {}, "overrides": [], "wide": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        sources = {name: f16_model(name, tmp) for name in MODELS}
        for name in MODELS:
            table["mixes"][name] = {}
            for mix in MIXES:
                dst = str(tmp / f"{name}.{mix}.gguf")
                subprocess.run([args.llama_quantize, sources[name], dst, mix, "1"], check=True, capture_output=True)
                table["mixes"][name][mix] = tensor_types(dst)
            table["mixes"][name] = by_mix(table["mixes"][name])
        for name in MODELS:
            wide = str(tmp / f"{name}.wide.gguf")
            widened(sources[name], wide, np.random.default_rng(0))
            table["wide"][name] = {}
            for mix in WIDE_MIXES:
                dst = str(tmp / f"{name}.wide.{mix}.gguf")
                subprocess.run([args.llama_quantize, wide, dst, mix, "1"], check=True, capture_output=True)
                table["wide"][name][mix] = tensor_types(dst)
            table["wide"][name] = by_mix(table["wide"][name])
        for name, mix, patterns, output_type in OVERRIDES:
            dst = str(tmp / "override.gguf")
            opts = [a for p in patterns for a in ("--tensor-type", p)]
            opts += ["--output-tensor-type", output_type] if output_type else []
            subprocess.run([args.llama_quantize, *opts, sources[name], dst, mix, "1"], check=True, capture_output=True)
            table["overrides"].append({"model": name, "mix": mix, "tensor_types": patterns,
                                       "output_tensor_type": output_type, "types": tensor_types(dst)})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(table, f, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.out}: {len(MODELS)} models x {len(MIXES)} mixes, {len(OVERRIDES)} override cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
