"""CPU backend ops against float64 numpy references on fresh random data."""
import gguf
import numpy as np
import pytest

import backend_reference as ref
from ember import _ember

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# Relative error bound of the matmul per weight type: the weights are exact (dequantized
# reference), the error comes from quantizing activations (8-bit for quantized weights).
MATMUL_TOL = {"F32": 1e-5, "F16": 1e-5, "BF16": 1e-5}


@pytest.fixture(scope="module")
def cpu():
    return _ember.Backend("cpu", 2)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_tok", [1, 7])
def test_matmul_matches_dequantized_reference(cpu, name, n_tok, rng):
    qtype = gguf.GGMLQuantizationType[name]
    n_in, n_out = 512, 48
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    # ember's quantizer (checked against gguf's in test_quant.py; gguf has none for K types),
    # gguf's dequantizer for the reference weights.
    wq = _ember.quantize(int(qtype), w.ravel()).reshape(n_out, -1)
    w_deq = gguf.quants.dequantize(wq, qtype).astype(np.float64).reshape(n_out, n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    y = cpu.matmul(int(qtype), wq, n_in, x)
    expect = x.astype(np.float64) @ w_deq.T
    err = np.abs(y - expect).max() / np.abs(expect).max()
    assert err < MATMUL_TOL.get(name, 2e-2), f"{name}: relative error {err}"


def test_rmsnorm(cpu, rng):
    x = rng.standard_normal((5, 576)).astype(np.float32) * 3
    g = rng.standard_normal(576).astype(np.float32)
    np.testing.assert_allclose(cpu.rmsnorm(x, g, 1e-5), ref.rmsnorm(x, g, 1e-5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("neox", [False, True])
def test_rope(cpu, neox, rng):
    pos = rng.integers(0, 4000, 6).tolist()
    x = rng.standard_normal((6, 4 * 64)).astype(np.float32)
    got = cpu.rope(x, pos, 4, 64, 10000.0, neox)
    np.testing.assert_allclose(got, ref.rope(x, pos, 4, 64, 10000.0, neox), rtol=1e-3, atol=1e-3)


def test_swiglu(cpu, rng):
    g, u = rng.standard_normal((2, 3000)).astype(np.float32) * 4
    np.testing.assert_allclose(cpu.swiglu(g, u), ref.swiglu(g, u), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block_size", [16, 5])
def test_paged_attention(cpu, block_size, rng):
    n_head, n_head_kv, hd, length = 6, 2, 64, 75
    k = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    pos = [0, 1, 17, 40, 74]
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    got = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, block_size, int(rng.integers(1 << 30)))
    # K/V are stored as f16 (as in llama.cpp), so agreement is to f16 precision.
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos, n_head, n_head_kv, hd), atol=5e-3)


def test_bad_arguments(cpu):
    with pytest.raises(ValueError, match="backend kind"):
        _ember.Backend("tpu", 1)
    with pytest.raises(ValueError, match="weight must be"):
        cpu.matmul(int(gguf.GGMLQuantizationType.Q4_0), np.zeros((4, 10), np.uint8), 32,
                   np.ones((1, 32), np.float32))


def test_paged_attention_f32_cache_is_exact(cpu, rng):
    n_head, n_head_kv, hd, length = 4, 4, 32, 33
    k = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    pos = [3, 32]
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    got = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, 8, 7, kv_type="f32")
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos, n_head, n_head_kv, hd), rtol=1e-5, atol=1e-5)


def _q8_0_round_trip(x):
    """x as a q8_0 cache holds it: gguf's quantizer (ggml's quantize_row_q8_0) and dequantizer."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.dequantize(gguf.quants.quantize(x, q8), q8).reshape(x.shape)


@pytest.mark.parametrize("block_size", [16, 5])
def test_paged_attention_q8_0_cache(cpu, block_size, rng):
    n_head, n_head_kv, hd, length = 6, 2, 64, 75   # GQA, 5 or 15 blocks through a shuffled table
    k = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    pos = [0, 1, 17, 40, 74]
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    got = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, block_size, int(rng.integers(1 << 30)),
                        kv_type="q8_0")
    # The cache rounds K and V as ggml's q8_0 does and the rest is f32: to f32 precision against
    # the reference on the rounded K and V.
    expect = ref.attention(q, _q8_0_round_trip(k), _q8_0_round_trip(v), pos, n_head, n_head_kv, hd)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    # Against the unrounded K and V: a value moves by at most 1/254 of its 32-group's largest
    # magnitude (~0.01 here); outputs, weighted means of V under scores moved as much, move by
    # that order (max 0.021 over 100 seeds).
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos, n_head, n_head_kv, hd), atol=5e-2)


def test_q8_0_cache_needs_head_dim_multiple_of_32(cpu):
    x = np.ones((2, 48), np.float32)
    with pytest.raises(ValueError, match="head_dim 48"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q8_0")
    with pytest.raises(ValueError, match="kv_type.*'q4_0'"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q4_0")
