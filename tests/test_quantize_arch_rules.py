"""ember-quantize's per-tensor types on the tiny hybrid, MoE and MLA models are llama-quantize's
(tests/reference/quantize_types.json, by tools/gen_quantize_type_references.py): routers, conv1d kernels, norms
and [n, 1] vectors kept as they are; ffn_down of every expert kind, attn_qkv and 8-expert attention taking
llama.cpp's more-bits rules."""
import json

import pytest
from gguf import GGUFReader

from ember import _ember as E

import hf_tiny
from conftest import rng_for
from quantize_wide import widened

REFERENCE = hf_tiny.ROOT / "tests" / "reference" / "quantize_types.json"
TABLE = json.loads(REFERENCE.read_text(encoding="utf-8"))


def by_mix(entry):
    """{mix: {tensor: type}} of a model's entry (tensor names once, then each mix's types in their order)."""
    return {mix: dict(zip(entry["tensors"], types)) for mix, types in entry["types"].items()}


MIXES = {name: by_mix(entry) for name, entry in TABLE["mixes"].items()}
WIDE = {name: by_mix(entry) for name, entry in TABLE.get("wide", {}).items()}


@pytest.fixture(scope="module")
def f16_models(tmp_path_factory):
    from ember.convert import convert
    root = tmp_path_factory.mktemp("quantize_arch")
    out = {}
    for name in MIXES:
        hf_tiny.build(name, str(root / name))
        out[name] = str(root / f"{name}.f16.gguf")
        convert(str(root / name), out[name], "f16", progress=False)
    return out


def types_of(path):
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


@pytest.mark.parametrize("name", sorted(MIXES))
def test_types_are_llama_quantize_types(f16_models, tmp_path, name):
    for mix, expected in sorted(MIXES[name].items()):
        out = str(tmp_path / f"{mix}.gguf")
        E.quantize_model(f16_models[name], out, mix, n_threads=1)
        got = types_of(out)
        diff = {t: (got.get(t), want) for t, want in expected.items() if got.get(t) != want}
        assert not diff and set(got) == set(expected), f"{name} {mix}: (ember, llama-quantize) {diff}"


@pytest.mark.parametrize("name", sorted(WIDE))
def test_k_types_on_wide_rows_are_llama_quantize_types(f16_models, tmp_path, name):
    src = str(tmp_path / "wide.gguf")
    widened(f16_models[name], src, rng_for("wide rows", name))
    for mix, expected in sorted(WIDE[name].items()):
        out = str(tmp_path / f"{mix}.gguf")
        E.quantize_model(src, out, mix, n_threads=1)
        got = types_of(out)
        diff = {t: (got.get(t), w) for t, w in expected.items() if got.get(t) != w}
        assert got == expected, f"{name} {mix}: (ember, llama-quantize) {diff}"


@pytest.mark.parametrize("case", TABLE["overrides"], ids=lambda c: c["model"])
def test_overrides_as_llama_quantize(f16_models, tmp_path, case):
    """The first matching --tensor-type wins; a tensor it sets does not advance the recipe's attn_v / ffn_down
    counts; a tied head's --output-tensor-type reaches the embedding."""
    out = str(tmp_path / "o.gguf")
    E.quantize_model(f16_models[case["model"]], out, case["mix"], n_threads=1, tensor_types=case["tensor_types"],
                     output_tensor_type=case["output_tensor_type"])
    got = types_of(out)
    assert got == case["types"], {t: (got.get(t), w) for t, w in case["types"].items() if got.get(t) != w}


def test_routers_and_kernels_stay_as_stored_under_overrides(f16_models, tmp_path):
    """As llama-quantize: --tensor-type reaches only the tensors the recipe may quantize, so a pattern naming the
    router, the shared expert's [n, 1] gate and the conv1d kernel leaves them as stored; it does move a shexp."""
    src, out = f16_models["qwen35moe"], str(tmp_path / "o.gguf")
    E.quantize_model(src, out, "Q8_0", n_threads=1,
                     tensor_types=["ffn_gate_inp=Q4_0", "ssm_conv1d=Q4_0", "ffn_up_shexp=Q4_0"])
    stored, got = types_of(src), types_of(out)
    for t in ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight", "blk.0.ssm_conv1d.weight",
              "blk.0.ssm_a", "blk.0.ssm_norm.weight"):
        assert got[t] == stored[t], t
    assert got["blk.0.ffn_up_shexp.weight"] == "Q4_0"
    assert got["blk.0.ffn_gate_shexp.weight"] == "Q8_0"


def test_unknown_mix_is_refused(f16_models, tmp_path):
    with pytest.raises(Exception, match="unknown quantization type 'Q4_K_XL'"):
        E.quantize_model(f16_models["lfm2moe"], str(tmp_path / "o.gguf"), "Q4_K_XL")


@pytest.mark.parametrize("name", ["qwen35moe", "qwen3next"])
def test_vector_written_without_its_trailing_1_loads(f16_models, tmp_path, name):
    """llama-quantize writes the shared expert's [n_embd, 1] gate as [n_embd] (ggml drops trailing 1s): ember
    loads such a file and computes what it does from the [n_embd, 1] one."""
    import numpy as np
    src = f16_models[name]
    gates = {t.name: np.asarray(t.data, np.float32).reshape(-1) for t in GGUFReader(src).tensors
             if t.name.endswith("ffn_gate_inp_shexp.weight")}
    assert gates
    flat = str(tmp_path / "flat.gguf")
    hf_tiny.rewritten_gguf(src, flat, drop=set(gates), extra=list(gates.items()))
    assert all(len(t.shape) == 1 for t in GGUFReader(flat).tensors if t.name in gates)
    ids = list(hf_tiny.LONG_PROMPT[:12])
    np.testing.assert_array_equal(hf_tiny.ember_logits(flat, ids), hf_tiny.ember_logits(src, ids))


def test_expert_ffn_down_outside_a_block_is_refused(f16_models, tmp_path):
    """An expert model's ffn_down tensors take their layer from the name: one outside blk.N is refused by name."""
    import numpy as np
    src = str(tmp_path / "extra.gguf")
    extra = rng_for("stray ffn_down").standard_normal((64, 64)).astype(np.float32)
    hf_tiny.rewritten_gguf(f16_models["qwen35moe"], src, extra=[("ffn_down_stray.weight", extra)])
    with pytest.raises(Exception, match="'ffn_down_stray.weight': an expert model's ffn_down tensors must be named"):
        E.quantize_model(src, str(tmp_path / "o.gguf"), "Q4_K_M", n_threads=1)
