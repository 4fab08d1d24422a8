"""nomic-embed-text v2 MoE ("nomic-bert-moe"): the tiny random checkpoint of nomic_moe_tiny in
nomic's own layout, converted by ember-convert and run by ember.Encoder on the CPU, against the
float64 forward tools/gen_nomic_moe_reference.py recorded (transformers has no MoE NomicBert);
the converted file's keys and tensors as llama.cpp lays them out; bad checkpoints and files."""
import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package reads the converted files' keys")

import nomic_moe_tiny as tiny  # noqa: E402

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

ARCH = "nomic-bert-moe"


@pytest.fixture(scope="module")
def reference():
    return tiny.reference()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """outtype -> the converted tiny model; "nobias": f32 with the experts' bias all zeros."""
    root = tmp_path_factory.mktemp("nomic_moe")
    tiny.build(str(root / "m"))
    tiny.build(str(root / "z"), zero_expert_bias=True)
    out = {}
    for name, src, outtype in (("f32", "m", "f32"), ("f16", "m", "f16"), ("nobias", "z", "f32")):
        out[name] = str(root / f"{name}.gguf")
        convert(str(root / src), out[name], outtype, progress=False)
    return out


def close(got, want):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    assert got.shape == want.shape
    return float(np.abs(got - want).max()), float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))


def test_reference_weights_are_the_drawn_ones(reference):
    import hashlib

    w = tiny.weights()
    digest = hashlib.sha256()
    for name in sorted(w):
        digest.update(name.encode() + w[name].tobytes())
    assert digest.hexdigest() == reference[1]["weights_sha256"], "rerun tools/gen_nomic_moe_reference.py"


def test_converted_keys(files):
    r = gguf.GGUFReader(files["f32"])
    field = lambda k: r.fields[f"{ARCH}.{k}"].parts[-1][0]  # noqa: E731
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == ARCH
    assert int(field("moe_every_n_layers")) == tiny.EVERY
    assert int(field("expert_count")) == tiny.X and int(field("expert_used_count")) == tiny.TOP_K
    assert int(field("pooling_type")) == 1 and not bool(field("attention.causal"))
    assert int(field("context_length")) == 512   # n_positions 2048 with 2048 trained: v2 MoE's 512, as llama.cpp
    t = {x.name: [int(d) for d in x.shape] for x in gguf.GGUFReader(files["f32"]).tensors}
    E, F, X = tiny.E, tiny.F, tiny.X
    for i in range(tiny.L):
        b = f"blk.{i}."
        assert t[b + "attn_q.weight"] == [E, E] and t[b + "attn_q.bias"] == [E]
        if tiny.is_moe(i):
            assert t[b + "ffn_gate_inp.weight"] == [E, X]
            assert t[b + "ffn_up_exps.weight"] == [E, F, X] and t[b + "ffn_down_exps.weight"] == [F, E, X]
            assert t[b + "ffn_down.bias"] == [E] and b + "ffn_up.weight" not in t
        else:
            assert t[b + "ffn_up.weight"] == [E, F] and t[b + "ffn_down.bias"] == [E]
            assert b + "ffn_gate_inp.weight" not in t
    # An all-zero experts' bias is dropped, as llama.cpp's converter drops it: llama.cpp loads that file.
    z = {x.name for x in gguf.GGUFReader(files["nobias"]).tensors}
    assert "blk.1.ffn_down.bias" not in z and "blk.0.ffn_down.bias" in z


def test_hidden_states_and_pooled_match_reference(files, reference):
    """All five sequences packed into one forward: tokens of several sequences share each expert's matmul."""
    ref = reference[0]
    m = _ember.Model(files["f32"])
    assert m.is_encoder
    rows = _ember.Encoder(m, n_batch=128, n_threads=2, pooling=0).encode(tiny.SEQS)
    pooled = _ember.Encoder(m, n_batch=128, n_threads=2).encode(tiny.SEQS)
    for i in range(len(tiny.SEQS)):
        for got, want in ((rows[i], ref[f"hidden_{i}"]), (pooled[i], ref[f"pooled_{i}"])):
            diff, cos = close(got, want)
            assert diff <= 1e-4 and cos >= 0.99999, f"sequence {i}: max|diff| {diff:.2e}, cosine {cos:.7f}"


def test_packing_does_not_change_results(files):
    m = _ember.Model(files["f32"])
    enc = _ember.Encoder(m, n_batch=128, n_threads=2, pooling=0)
    packed = enc.encode(tiny.SEQS)
    for i, ids in enumerate(tiny.SEQS):
        diff, _ = close(enc.encode([ids])[0], packed[i])
        assert diff <= 1e-5, f"sequence {i} alone differs from packed by {diff:.2e}"


def test_f16_file(files, reference):
    m = _ember.Model(files["f16"])
    pooled = _ember.Encoder(m, n_batch=128, n_threads=2).encode(tiny.SEQS)
    for i in range(len(tiny.SEQS)):
        _, cos = close(pooled[i], reference[0][f"pooled_{i}"])
        assert cos >= 0.999, f"sequence {i}: cosine {cos:.6f}"


def _build_with(tmp_path, **changes):
    d = tmp_path / "bad"
    tiny.build(str(d))
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("changes, message", [
    (dict(moe_normalize_expert_weights=True), "moe_normalize_expert_weights"),
    (dict(activation_function="swiglu"), "expected gelu"),
    (dict(moe_top_k=5), "moe_top_k"),
    (dict(rotary_emb_fraction=0.5), "rotary"),
    (dict(qkv_proj_bias=False), "qkv_proj_bias=false"),
    (dict(moe_every_n_layers=3), "missing tensor encoder.layers.3.mlp.fc1"),   # every 3: layer 3 is dense
])
def test_convert_refuses_bad_checkpoints(tmp_path, changes, message):
    d = _build_with(tmp_path, **changes)
    with pytest.raises(ConvertError, match=message):
        convert(str(d), str(tmp_path / "bad.gguf"), "f32", progress=False)


def test_load_refuses_experts_in_the_wrong_layers(files, tmp_path):
    """A file whose moe_every_n_layers does not give the layers that hold experts."""
    import shutil

    path = str(tmp_path / "every3.gguf")
    shutil.copy(files["f32"], path)
    r = gguf.GGUFReader(path, "r+")
    r.fields[f"{ARCH}.moe_every_n_layers"].parts[-1][0] = 3
    del r
    with pytest.raises(ValueError, match=r"blk\.3 must not have ffn_gate_inp\.weight.*moe_every_n_layers is 3"):
        _ember.Model(path)


def _fused(src, dst, keep_separate_bias=False):
    """The file as llama.cpp's converter lays nomic-bert-moe out: Q, K, V and their biases fused into
    attn_qkv.weight and attn_qkv.bias (keep_separate_bias: attn_q/k/v.bias left beside them too)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        writer.add_key_value(f.name, f.contents(), f.types[0],
                             f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        parts = t.name.split(".")
        kind = parts[2] if len(parts) == 4 else None
        if kind not in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        b, what = ".".join(parts[:2]), parts[3]
        if kind == "attn_q":
            fused = np.concatenate([np.asarray(tensors[f"{b}.attn_{x}.{what}"].data) for x in "qkv"])
            writer.add_tensor(f"{b}.attn_qkv.{what}", fused)
        if keep_separate_bias and what == "bias":
            writer.add_tensor(t.name, np.asarray(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_llama_cpp_layout_with_fused_qkv_and_bias(files, tmp_path):
    """llama.cpp's converter writes attn_qkv.weight and attn_qkv.bias: the same outputs as the split file."""
    path = str(tmp_path / "fused.gguf")
    _fused(files["f32"], path)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert "blk.0.attn_qkv.bias" in names and "blk.0.attn_q.bias" not in names and "blk.0.attn_k.weight" not in names
    want = _ember.Encoder(_ember.Model(files["f32"]), n_batch=128, n_threads=2, pooling=0).encode(tiny.SEQS)
    got = _ember.Encoder(_ember.Model(path), n_batch=128, n_threads=2, pooling=0).encode(tiny.SEQS)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    bad = str(tmp_path / "both.gguf")
    _fused(files["f32"], bad, keep_separate_bias=True)
    with pytest.raises(ValueError, match="attn_qkv.bias needs attn_qkv.weight and no separate"):
        _ember.Model(bad)


@pytest.mark.skipif("cuda" not in _ember.backends(), reason="this ember was built without the CUDA backend")
@pytest.mark.parametrize("n_gpu_layers", [-1, 2], ids=["all", "last_two"])
def test_gpu_matches_reference(files, reference, n_gpu_layers):
    """The experts' routing and row primitives on the GPU; with 2 layers there, the hidden state crosses
    from the CPU before the second mixture layer."""
    m = _ember.Model(files["f32"], n_gpu_layers=n_gpu_layers)
    rows = _ember.Encoder(m, n_batch=128, n_threads=2, pooling=0).encode(tiny.SEQS)
    for i, got in enumerate(rows):
        diff, cos = close(got, reference[0][f"hidden_{i}"])
        assert diff <= 1e-4 and cos >= 0.99999, f"sequence {i}: max|diff| {diff:.2e}, cosine {cos:.7f}"
