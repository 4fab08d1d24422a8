"""CPU backend ops against float64 numpy references on fresh random data."""
import gguf
import numpy as np
import pytest

import backend_reference as ref
from conftest import at_simd_level, kernel_module, simd_levels

K = kernel_module()

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# Relative error bound of the matmul per weight type: the weights are exact (dequantized
# reference), the error comes from quantizing activations (8-bit for quantized weights).
MATMUL_TOL = {"F32": 1e-5, "F16": 1e-5, "BF16": 1e-5}


@pytest.fixture(scope="module")
def cpu():
    return K.Backend("cpu", 2)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_tok", [1, 7])
def test_matmul_matches_dequantized_reference(cpu, name, n_tok, rng):
    qtype = gguf.GGMLQuantizationType[name]
    n_in, n_out = 512, 48
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    # ember's quantizer (checked against gguf's in test_quant.py; gguf has none for K types),
    # gguf's dequantizer for the reference weights.
    wq = K.quantize(int(qtype), w.ravel()).reshape(n_out, -1)
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


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_act(cpu, act, rng):
    g, u = rng.standard_normal((2, 3000)).astype(np.float32) * 4
    np.testing.assert_allclose(cpu.gated_act(g, u, act), ref.gated_act(g, u, act), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [16, 257, 49152])
def test_argmax_rows(cpu, width, rng):
    x = ref.argmax_cases(rng, width)
    assert cpu.argmax_rows(x) == ref.greedy_ids(x)
    with pytest.raises(ValueError, match="argmax_rows"):
        cpu.argmax_rows(np.zeros((0, 4), np.float32))


def test_head_rmsnorm(cpu, rng):
    n_tok, n_heads, hd = 5, 6, 64
    x = rng.standard_normal((n_tok, n_heads * hd)).astype(np.float32) * rng.uniform(0.1, 5, (n_tok, n_heads * hd))
    g = rng.standard_normal(hd).astype(np.float32)
    got = cpu.head_rmsnorm(x, g, n_heads, hd, 1e-6)
    np.testing.assert_allclose(got, ref.head_rmsnorm(x, g, n_heads, hd, 1e-6), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scaling", ["freq_factors", "linear", "yarn"])
@pytest.mark.parametrize("neox", [False, True])
def test_rope_scaling(cpu, scaling, neox, rng):
    n_heads, hd = 3, 64
    pos = rng.integers(0, 8000, 6).tolist()
    x = rng.standard_normal((6, n_heads * hd)).astype(np.float32)
    params = ref.rope_scalings(hd, rng)[scaling]
    got = cpu.rope(x, pos, n_heads, hd, 10000.0, neox, **params)
    np.testing.assert_allclose(got, ref.rope(x, pos, n_heads, hd, 10000.0, neox, **params), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_sliding_window_attention(cpu, kv_type, rng):
    """A window shorter than the sequence: each query sees only its last `window` positions."""
    n_head, n_head_kv, hd, length, window = 4, 2, 64, 70, int(rng.integers(3, 20))
    k = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    pos = [0, window - 1, window, 33, 69]
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    got = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, 16, int(rng.integers(1 << 30)), kv_type=kv_type,
                        window=window)
    tol = 1e-5 if kv_type == "f32" else 5e-3
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos, n_head, n_head_kv, hd, window), rtol=tol, atol=tol)


def float_weight(rng, n_out, n_in):
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_ffn(cpu, act, rng):
    """The fused feed-forward op (residual add, norm, gate/up, gated activation, down) on F32 weights."""
    n_in, n_ff, n_tok = 64, 96, 3
    gate, up, down = float_weight(rng, n_ff, n_in), float_weight(rng, n_ff, n_in), float_weight(rng, n_in, n_ff)
    x, res = rng.standard_normal((2, n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    f32 = int(gguf.GGMLQuantizationType.F32)
    out, x_sum = cpu.ffn(f32, gate.view(np.uint8), up.view(np.uint8), down.view(np.uint8), n_in, x, norm, 1e-5, res,
                         act)
    xs = x.astype(np.float64) + res
    xn = ref.rmsnorm(xs, norm, 1e-5)
    expect = ref.gated_act(xn @ gate.T, xn @ up.T, act) @ down.T
    np.testing.assert_allclose(x_sum, xs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


def test_attn_in(cpu, rng):
    """The fused attention input op with biases and per-head q/k norms (Qwen-style), F32 weights:
    q rotated, k rotated and v stored in the f16 cache at each token's position."""
    n_in, n_head, n_kv, hd = 64, 4, 2, 16
    wq, wk, wv = (float_weight(rng, n * hd, n_in) for n in (n_head, n_kv, n_kv))
    bq, bk, bv = (rng.standard_normal(n * hd).astype(np.float32) for n in (n_head, n_kv, n_kv))
    q_norm, k_norm = rng.uniform(0.5, 1.5, (2, hd)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    pos = sorted(int(p) for p in rng.choice(40, 3, replace=False))
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    f32 = int(gguf.GGMLQuantizationType.F32)
    q, k_cache, v_cache, _ = cpu.attn_in(f32, wq.view(np.uint8), wk.view(np.uint8), wv.view(np.uint8), n_in, x, pos,
                                         hd, 10000.0, True, 16, norm, 1e-6, None, bq, bk, bv, q_norm, k_norm)
    xn = ref.rmsnorm(x, norm, 1e-6)
    want_q = ref.rope(ref.head_rmsnorm(xn @ wq.T + bq, q_norm, n_head, hd, 1e-6), pos, n_head, hd, 10000.0, True)
    want_k = ref.rope(ref.head_rmsnorm(xn @ wk.T + bk, k_norm, n_kv, hd, 1e-6), pos, n_kv, hd, 10000.0, True)
    np.testing.assert_allclose(q, want_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k_cache, want_k, rtol=2e-3, atol=2e-3)   # f16 cache
    np.testing.assert_allclose(v_cache, xn @ wv.T + bv, rtol=2e-3, atol=2e-3)


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
    with pytest.raises(ValueError, match="backend 'tpu' is not built"):
        K.Backend("tpu", 1)
    with pytest.raises(ValueError, match="act must be"):
        cpu.gated_act(np.ones(4, np.float32), np.ones(4, np.float32), "relu")
    with pytest.raises(ValueError, match="freq_factors must be"):
        cpu.rope(np.ones((1, 64), np.float32), [0], 1, 64, 10000.0, False, freq_factors=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="window must be"):
        cpu.attention(np.ones((1, 32), np.float32), np.ones((2, 32), np.float32), np.ones((2, 32), np.float32), [1],
                      1, 1, 32, 16, window=-1)
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
    expect = ref.attention(q, ref.kv_round(k, "q8_0"), ref.kv_round(v, "q8_0"), pos, n_head, n_head_kv, hd)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    # Against the unrounded K and V: a value moves by at most 1/254 of its 32-group's largest
    # magnitude (~0.01 here); outputs, weighted means of V under scores moved as much, move by
    # that order (max 0.021 over 100 seeds).
    np.testing.assert_allclose(got, ref.attention(q, k, v, pos, n_head, n_head_kv, hd), atol=5e-2)


@pytest.mark.parametrize("type_k", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("type_v", ["f32", "f16", "q8_0"])
def test_paged_attention_mixed_kv_types(cpu, type_k, type_v, rng):
    """K and V each in its own type: the reference over K and V rounded as their caches hold them.
    q is rounded to f16 for an f16 K and the probabilities for an f16 V (as llama.cpp), so only
    pairs without f16 match to f32 precision."""
    n_head, n_head_kv, hd, length = 6, 2, 64, 45
    k = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_head_kv * hd)).astype(np.float32)
    pos = [0, 15, 16, 30, 44]
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    got = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, 16, int(rng.integers(1 << 30)),
                        type_k=type_k, type_v=type_v)
    expect = ref.attention(q, ref.kv_round(k, type_k), ref.kv_round(v, type_v), pos, n_head, n_head_kv, hd)
    tol = 5e-3 if "f16" in (type_k, type_v) else 1e-5
    np.testing.assert_allclose(got, expect, rtol=tol, atol=tol)
    if type_k != type_v:   # each cache's type takes effect: neither single-type cache gives this
        same_k = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, 16, 1, type_k=type_k, type_v=type_k)
        same_v = cpu.attention(q, k, v, pos, n_head, n_head_kv, hd, 16, 1, type_k=type_v, type_v=type_v)
        assert not np.array_equal(got, same_k) and not np.array_equal(got, same_v)


def test_q8_0_cache_needs_head_dim_multiple_of_32(cpu):
    x = np.ones((2, 48), np.float32)
    with pytest.raises(ValueError, match="head_dim 48"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q8_0")
    with pytest.raises(ValueError, match="type_v: a Q8_0 KV cache needs .*head_dim 48"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, type_v="q8_0")
    with pytest.raises(ValueError, match="kv_type.*'q4_0'"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q4_0")
    with pytest.raises(ValueError, match="type_k.*'q4_0'"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, type_k="q4_0")
    with pytest.raises(ValueError, match="kv_type .*or type_k / type_v, not both"):
        cpu.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="f16", type_v="f32")


def test_gated_act_simd_matches_scalar_bit_for_bit(rng):
    """AVX-512's gated activations (src/cpu/activation_avx512.cpp: expf in double as glibc's FMA
    build) give the scalar loop's bits, across expf's whole range and its special cases. Each level
    is a backend made under its EMBER_SIMD value."""
    if simd_levels()[0] != "avx512":
        pytest.skip("this CPU runs no AVX-512 kernels: the scalar activation is the only one here")
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 88.72, 88.73, -87.3, -103.9, -104.0, -150.0, 1e30, -1e30,
                      np.inf, -np.inf, np.nan, 0.5, -0.5], np.float32)
    g = np.concatenate([edges, rng.uniform(-120, 100, 40000).astype(np.float32),
                        rng.standard_normal(3001).astype(np.float32) * 4])
    u = rng.standard_normal(g.size).astype(np.float32)
    with at_simd_level("scalar"):
        scalar = K.Backend("cpu", 2)
    best = K.Backend("cpu", 2)
    for act in ("silu", "gelu_tanh"):
        want, got = scalar.gated_act(g, u, act), best.gated_act(g, u, act)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), act
