"""tools/synthetic_gguf.py, the random-weight models of the device benchmarks: every shape family
written tiny, the llama, qwen3, qwen3moe and gpt-oss ones loaded by ember and run, the MoE and hybrid ones checked
tensor by tensor against the layout llama.cpp reads; bad input named."""
import gzip
import importlib.util

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from conftest import ROOT
from ember import _ember

_spec = importlib.util.spec_from_file_location("synthetic_gguf", ROOT / "tools" / "synthetic_gguf.py")
synthetic_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic_gguf)

SMOLLM2_VOCAB = 49152


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "smollm2-vocab.gguf"
    path.write_bytes(gzip.decompress((ROOT / "tests" / "fuzz" / "vocab" / "smollm2.gguf.gz").read_bytes()))
    return str(path)


def _write(tmp_path, vocab, rng, shape):
    out = str(tmp_path / f"{shape}.gguf")
    synthetic_gguf.write_model(out, shape, vocab, ctx=256, seed=int(rng.integers(2**31)))
    return out


def _field(reader, key):
    value, _ = synthetic_gguf._field_value(reader.fields[key])
    return value


@pytest.mark.parametrize("shape", ["llama-tiny", "qwen3-tiny", "qwen3moe-tiny", "gpt-oss-tiny", "phi3-tiny",
                                   "gemma2-tiny", "gemma4-tiny", "llama4-tiny"])
def test_dense_shapes_load_and_run(tmp_path, vocab, rng, shape):
    s = synthetic_gguf.SHAPES[shape]
    model = _ember.Model(_write(tmp_path, vocab, rng, shape))
    assert (model.arch, model.n_layer, model.n_embd, model.n_head, model.n_head_kv, model.n_vocab) == \
        (s.arch, s.n_layers, s.dim, s.n_heads, s.n_kv_heads, SMOLLM2_VOCAB)
    ctx = _ember.Context(model, n_ctx=64, n_batch=64, n_threads=2)
    ctx.eval(rng.integers(0, SMOLLM2_VOCAB, 5).tolist())
    ctx.eval([int(rng.integers(0, SMOLLM2_VOCAB))])
    logits = np.asarray(ctx.logits())
    assert logits.shape == (SMOLLM2_VOCAB,) and np.isfinite(logits).all() and logits.std() > 0


def test_moe_shape_has_stacked_experts(tmp_path, vocab, rng):
    s = synthetic_gguf.SHAPES["qwen3moe-tiny"]
    r = GGUFReader(_write(tmp_path, vocab, rng, "qwen3moe-tiny"))
    assert _field(r, "general.architecture") == "qwen3moe"
    assert (_field(r, "qwen3moe.expert_count"), _field(r, "qwen3moe.expert_used_count"),
            _field(r, "qwen3moe.expert_feed_forward_length")) == (s.n_experts, s.n_experts_used, s.expert_ffn)
    t = {x.name: x for x in r.tensors}
    # GGUF lists dimensions innermost first (ggml's order).
    assert list(t["blk.0.ffn_gate_inp.weight"].shape) == [s.dim, s.n_experts]
    for name in ("ffn_gate_exps", "ffn_up_exps"):
        assert list(t[f"blk.3.{name}.weight"].shape) == [s.dim, s.expert_ffn, s.n_experts]
    assert list(t["blk.3.ffn_down_exps.weight"].shape) == [s.expert_ffn, s.dim, s.n_experts]
    assert list(t["blk.1.attn_q_norm.weight"].shape) == [s.head_dim]
    assert not any("ffn_gate.weight" in n for n in t)
    weights = t["blk.2.ffn_up_exps.weight"].data
    assert weights.dtype == np.float16 and np.asarray(weights).std() > 0


def test_q8_0_matrices_load_and_run(tmp_path, vocab, rng):
    out = str(tmp_path / "q8.gguf")
    synthetic_gguf.write_model(out, "qwen3moe-tiny", vocab, ctx=256, seed=int(rng.integers(2**31)), matrix_type="Q8_0")
    r = GGUFReader(out)
    t = {x.name: x for x in r.tensors}
    assert _field(r, "general.file_type") == 7
    assert t["blk.0.ffn_up_exps.weight"].tensor_type.name == "Q8_0"
    assert t["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    ctx = _ember.Context(_ember.Model(out), n_ctx=64, n_batch=64, n_threads=2)
    ctx.eval(rng.integers(0, SMOLLM2_VOCAB, 4).tolist())
    logits = np.asarray(ctx.logits())
    assert np.isfinite(logits).all() and logits.std() > 0
    with pytest.raises(ValueError, match="unknown matrix type 'Q4_0'"):
        synthetic_gguf.write_model(str(tmp_path / "x.gguf"), "qwen3moe-tiny", vocab, matrix_type="Q4_0")


def test_decode_bytes_count_only_the_experts_a_token_takes(tmp_path, vocab, rng):
    from ember.bench import decode_bytes_per_token

    s = synthetic_gguf.SHAPES["qwen3moe-tiny"]
    path = _write(tmp_path, vocab, rng, "qwen3moe-tiny")
    tensors = _ember.GGUFFile(path).tensors()
    experts = sum(t["nbytes"] for t in tensors if "_exps." in t["name"])
    names = {t["name"] for t in tensors}
    # A decode step reads one embedding row, unless the head is the tied token_embd.
    skip = {"token_embd.weight"} if "output.weight" in names else set()
    rest = sum(t["nbytes"] for t in tensors if "_exps." not in t["name"] and t["name"] not in skip)
    assert decode_bytes_per_token(_ember.Model(path), "f16", 0) == rest + experts * s.n_experts_used // s.n_experts


def test_hybrid_shape_mixes_conv_and_attention_layers(tmp_path, vocab, rng):
    s = synthetic_gguf.SHAPES["lfm2-tiny"]
    r = GGUFReader(_write(tmp_path, vocab, rng, "lfm2-tiny"))
    assert _field(r, "lfm2.shortconv.l_cache") == s.conv_cache
    kv = _field(r, "lfm2.attention.head_count_kv")
    assert kv == [s.n_kv_heads if i in s.attn_layers else 0 for i in range(s.n_layers)]
    names = {x.name for x in r.tensors}
    for i in range(s.n_layers):
        attends = f"blk.{i}.attn_q.weight" in names
        convolves = f"blk.{i}.shortconv.conv.weight" in names
        assert (attends, convolves) == (i in s.attn_layers, i not in s.attn_layers), i
    assert "token_embd_norm.weight" in names and "output.weight" not in names


def test_full_size_parameter_counts():
    # llama2-7b with its own 32,000-token vocabulary is the 6.74B-parameter model.
    n = sum(int(np.prod(shape)) for _, shape, _ in synthetic_gguf.tensors(synthetic_gguf.SHAPES["llama2-7b"], 32000))
    assert n == 6_738_415_616
    moe = synthetic_gguf.SHAPES["qwen3-30b-a3b"]
    n = sum(int(np.prod(shape)) for _, shape, _ in synthetic_gguf.tensors(moe, 151936))
    assert 30.0e9 < n < 31.0e9
    # Gemma 2 9B with its 256,000-token vocabulary (tied head).
    n = sum(int(np.prod(shape)) for _, shape, _ in synthetic_gguf.tensors(synthetic_gguf.SHAPES["gemma2-9b"], 256000))
    assert n == 9_241_705_984
    # Gemma 4 31B's text model (its 262,144-token vocabulary, tied head) is the 30.7B-parameter one.
    n = sum(int(np.prod(shape)) for _, shape, _ in synthetic_gguf.tensors(synthetic_gguf.SHAPES["gemma4-31b"], 262144))
    assert 30.65e9 < n < 30.75e9


def test_vocab_only_copies_the_tokenizer(tmp_path, vocab):
    out = str(tmp_path / "v.gguf")
    assert synthetic_gguf.write_vocab(out, vocab) == SMOLLM2_VOCAB
    b = GGUFReader(out)
    expect = {key: value for key, value, _, _ in synthetic_gguf._tokenizer_keys(vocab)}
    assert {key: _field(b, key) for key in expect} == expect
    assert not b.tensors


def test_bad_input_is_named(tmp_path, vocab):
    with pytest.raises(ValueError, match="unknown shape 'llama-9b'"):
        synthetic_gguf.write_model(str(tmp_path / "x.gguf"), "llama-9b", vocab)
    with pytest.raises(ValueError, match="context length must be positive"):
        synthetic_gguf.write_model(str(tmp_path / "x.gguf"), "llama-tiny", vocab, ctx=0)
    no_tokens = tmp_path / "no-tokens.gguf"
    w = GGUFWriter(str(no_tokens), "llama")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="no tokenizer.ggml.tokens"):
        synthetic_gguf.write_model(str(tmp_path / "x.gguf"), "llama-tiny", str(no_tokens))
    with pytest.raises(SystemExit):
        synthetic_gguf.main(["--shape", "llama-tiny", "-o", str(tmp_path / "x.gguf")])
