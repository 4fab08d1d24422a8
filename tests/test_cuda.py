"""What only the CUDA backend promises, on fresh random data: the CPU backend's bits where its
kernels keep the CPU's order of sums (legacy-format GEMV, rope, gated activations, rmsnorm, the
reference-order attention), fused kernels bit for bit as the unfused ones, attention_short, and
whole models on the GPU (CUDA graphs, streamed partial offload, KV types) against the CPU. Every op
against its float64 reference, on every backend and kernel choice: tests/test_backend_ops.py.
Skipped with the reason when ember has no CUDA backend or no GPU."""
import numpy as np
import pytest
import gguf.quants
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

import backend_reference as ref_ops
from conftest import kernel_module, rng_for, switches_overridden

from ember import _ember
from ember.switches import overridden

E = kernel_module()

# Byte offsets of fp16 scale fields in one block: random bytes there could be inf / NaN.
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def cuda_backend(**switches):
    """A CUDA backend made with these EMBER_* switches (over the environment; it keeps them), or a
    skip naming why there is none (built without CUDA, or no device)."""
    if "cuda" not in E.backend_names():
        pytest.skip(f"this ember was built without the CUDA backend (built in: {E.backend_names()})")
    try:
        with switches_overridden(**switches):
            return E.Backend("cuda")
    except ValueError as e:
        if "EMBER_" in str(e):
            raise
        pytest.skip(f"no CUDA device: {e}")


@pytest.fixture(scope="module")
def gpu():
    return cuda_backend()


@pytest.fixture(scope="module")
def cpu():
    return E.Backend("cpu", 2)



def random_weight(t, n_out, n_in, rng):
    """[n_out, row_bytes] uint8: random quants with finite random scales (or random floats)."""
    if t == T.F32:
        return rng.standard_normal((n_out, n_in)).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return rng.standard_normal((n_out, n_in)).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        f = rng.standard_normal((n_out, n_in)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    be, bb = GGML_QUANT_SIZES[t]
    nb = n_in // be
    blocks = rng.integers(0, 256, size=(n_out * nb, bb), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        d = (rng.uniform(0.002, 0.05, n_out * nb) * rng.choice([-1, 1], n_out * nb)).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_out, nb * bb)


def quantized_weight(t, n_out, n_in, rng, scale=1.0):
    """[n_out, row_bytes] uint8: normal floats (outputs of about `scale` for unit inputs) quantized
    to t, where a product of several matrices needs realistic magnitudes (random K-quant bytes
    give huge weights, and the attention one-hot)."""
    f = (rng.standard_normal((n_out, n_in)) * scale / np.sqrt(n_in)).astype(np.float32)
    if t == T.F16:
        return f.astype(np.float16).view(np.uint8)
    return np.asarray(E.quantize(int(t), f.ravel())).reshape(n_out, -1)


def dequant(t, w, n_in):
    if t == T.F32:
        return w.view(np.float32).reshape(w.shape[0], n_in).astype(np.float64)
    return gguf.quants.dequantize(w, t).reshape(w.shape[0], n_in).astype(np.float64)


def rel_err(y, ref):
    assert np.all(np.isfinite(y)), "non-finite output"
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


# The GPU's legacy-format GEMV sums in the order of the CPU's AVX-512 kernels (cuda/gemv_legacy.cuh:
# Q5_0 and Q5_1 as the dot products, Q4_0, Q4_1 and Q8_0 as the fast kernel that takes every batch
# of them), and both quantize activations alike, so on an AVX-512 host the results are bit for bit
# the CPU's; other hosts sum in other orders.
SAME_BITS_AS_CPU = E.simd_level() == "avx512"


def assert_same_bits(yg, yc, what):
    yg, yc = np.asarray(yg), np.asarray(yc)
    diff = np.flatnonzero(yg.view(np.uint32) != yc.view(np.uint32))
    assert diff.size == 0, (f"{what}: {diff.size} of {yg.size} values differ from the CPU's, first at "
                            f"{diff[0]}: {yg.flat[diff[0]]!r} vs {yc.flat[diff[0]]!r}")


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [1, 5, 37])
def test_legacy_gemv_bits_match_cpu(gpu, cpu, t, n_tok):
    """Widths of 16 blocks (whole groups of 4), 17 (an odd last block), 18 (a last pair), 19 (both)
    and 48 (SmolLM2's down projection)."""
    rng = rng_for("gemv_cpu", t.name, n_tok)
    for n_in in (512, 544, 576, 608, 1536):
        w = random_weight(t, 70, n_in, rng)
        x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
        yg, yc = gpu.matmul(int(t), w, n_in, x), cpu.matmul(int(t), w, n_in, x)
        if SAME_BITS_AS_CPU:
            assert_same_bits(yg, yc, f"{t.name} n_in {n_in}")
        else:
            assert rel_err(yg, yc) < 2e-4


def test_rope_gated_act_match_cpu(gpu, cpu):
    rng = rng_for("rope_gated_act_cpu")
    pos = [int(p) for p in rng.integers(0, 500, 6)]
    x = rng.standard_normal((6, 9 * 64)).astype(np.float32)
    for neox in (False, True):
        # the GPU rotates by the CPU's cos and sin (cuda/rope_table.h)
        assert_same_bits(gpu.rope(x, pos, 9, 64, 100000.0, neox), cpu.rope(x, pos, 9, 64, 100000.0, neox), "rope")
    # exp as glibc's expf (cuda/common.cuh); the wide range reaches its overflow and underflow
    g = np.concatenate([rng.standard_normal(4096) * 4, rng.uniform(-120, 120, 4096)]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    for act in ("silu", "gelu_tanh"):
        assert_same_bits(gpu.gated_act(g, u, act), cpu.gated_act(g, u, act), act)


def test_rmsnorm_same_bits_as_cpu(gpu, cpu):
    rng = rng_for("rmsnorm")
    x = rng.standard_normal((5, 4096)).astype(np.float32) * 3
    g = rng.standard_normal(4096).astype(np.float32)
    assert_same_bits(gpu.rmsnorm(x, g, 1e-5), cpu.rmsnorm(x, g, 1e-5), "rmsnorm")


def rope_ref(x, pos, n_heads, hd, base, neox):
    x = x.astype(np.float64).reshape(len(pos), n_heads, hd).copy()
    i = np.arange(hd // 2)
    theta = np.asarray(pos, np.float64)[:, None] * base ** (-2.0 * i / hd)   # [n_tok, hd/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., : hd // 2].copy(), x[..., hd // 2:].copy()
        x[..., : hd // 2], x[..., hd // 2:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
    return x.reshape(len(pos), -1)


def test_head_rmsnorm_matches_cpu(gpu, cpu):
    rng = rng_for("head_rmsnorm")
    n_tok, n_heads, hd = 5, 8, 128
    x = (rng.standard_normal((n_tok, n_heads * hd)) * rng.uniform(0.1, 5, (n_tok, n_heads * hd))).astype(np.float32)
    g = rng.standard_normal(hd).astype(np.float32)
    assert rel_err(gpu.head_rmsnorm(x, g, n_heads, hd, 1e-6), cpu.head_rmsnorm(x, g, n_heads, hd, 1e-6)) < 1e-6


@pytest.mark.parametrize("scaling", ["freq_factors", "linear", "yarn"])
@pytest.mark.parametrize("neox", [False, True])
def test_rope_scaling_same_bits_as_cpu(gpu, cpu, scaling, neox):
    rng = rng_for("rope_scaling", scaling, neox)
    n_heads, hd = 4, 128
    pos = [int(p) for p in rng.integers(0, 8000, 7)]
    x = rng.standard_normal((7, n_heads * hd)).astype(np.float32)
    params = ref_ops.rope_scalings(hd, rng)[scaling]
    y = gpu.rope(x, pos, n_heads, hd, 500000.0, neox, **params)
    # the GPU rotates by the CPU's cos and sin (cuda/rope_table.h)
    assert_same_bits(y, cpu.rope(x, pos, n_heads, hd, 500000.0, neox, **params), f"rope {scaling}")


@pytest.mark.parametrize("n_rot", [24, 64], ids=["partial", "whole"])
@pytest.mark.parametrize("neox", [False, True])
def test_partial_rope_and_temperature_same_bits_as_cpu(gpu, cpu, n_rot, neox):
    """Partial rotary (Phi-3, GLM-4) through the rope kernel, and the attention temperature (Mistral
    3): the GPU's bits are the CPU's (the same rope tables; the temperature in double on both)."""
    rng = rng_for("partial_rope", n_rot, neox)
    n_heads, hd = 3, 96
    pos = [int(p) for p in rng.integers(0, 9000, 11)]
    x = rng.standard_normal((11, n_heads * hd)).astype(np.float32)
    params = ref_ops.rope_scalings(n_rot, rng)["freq_factors"]
    assert_same_bits(gpu.rope(x, pos, n_heads, hd, 10000.0, neox, n_rot=n_rot, **params),
                     cpu.rope(x, pos, n_heads, hd, 10000.0, neox, n_rot=n_rot, **params), "partial rope")
    assert_same_bits(gpu.attn_temperature(x, pos, 0.1, 512), cpu.attn_temperature(x, pos, 0.1, 512), "temperature")


# (n_head, n_head_kv, head_dim, kv length, query positions, block_size): decode shapes of each
# attention kernel that writes the O projection's q8_1 input (every shape's attention against the
# reference: tests/test_backend_ops.py)
ATTN_CASES = {
    "decode": (8, 8, 128, 77, [76], 16),
    "decode_batch": (4, 2, 128, 64, [10, 63, 40], 16),
    "long_split": (8, 8, 128, 3000, [2999], 16),
    "long_split_gqa": (32, 8, 128, 2500, [1000, 2499], 64),
    "long_split_hd256": (4, 2, 256, 1500, [1499], 16),
    "long_split_hd512": (8, 1, 512, 1500, [1499], 16),   # the tiled kernel: no q8_1 output of its own
}


def attention_inputs(shape, rng):
    """Fresh random q, k, v for an ATTN_CASES-style shape."""
    n_head, n_kv, hd, length, pos, _ = shape
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    k = rng.standard_normal((length, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((length, n_kv * hd)).astype(np.float32)
    return q, k, v


# The engine's default-mode decode steps over short f16 contexts where EMBER_CUDA_SHORT_ATTN=1
# asks for attention_short: each query its own sequence over the same blocks. (n_head, n_head_kv,
# head_dim, kv length, query positions, block_size, window)
SHORT_CASES = {
    "first_token": (8, 8, 128, 1, [0], 16, 0),
    "decode": (8, 8, 128, 77, [76], 16, 0),
    "gqa_9_3": (9, 3, 64, 200, [199], 16, 0),
    "batch": (4, 2, 128, 300, [10, 299, 63, 128], 16, 0),   # short ones leave CTAs of the cluster empty
    "longest": (4, 1, 128, 512, [511, 0], 16, 0),           # 8 CTAs of 64 keys
    "hd256": (2, 1, 256, 130, [129, 64], 16, 0),
    "window": (8, 2, 64, 300, [299, 100, 20], 16, 40),
    "gqa_8": (32, 4, 128, 260, [259], 32, 0),
    "head_dim_80": (4, 2, 80, 90, [89, 3], 16, 0),          # not a head dim it takes: another kernel
    "past_short": (4, 2, 128, 600, [599, 300], 16, 0),      # a context past kShortMaxLen: another kernel
    "many": (4, 2, 64, 100, list(range(30, 100)), 16, 0),   # more sequences than it takes: another kernel
}


@pytest.fixture
def short_gpu():
    """A CUDA backend whose fast_attention batches take attention_short (EMBER_CUDA_SHORT_ATTN=1)."""
    return cuda_backend(EMBER_CUDA_SHORT_ATTN="1")


def short_inputs(case):
    n_head, n_kv, hd, length, pos, bs, window = SHORT_CASES[case]
    rng = rng_for("attention_short", case)
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    k, v = rng.standard_normal((2, length, n_kv * hd)).astype(np.float32)
    return rng, q, k, v


@pytest.mark.parametrize("case", list(SHORT_CASES))
def test_attention_short(short_gpu, case):
    """Each query's attention equals float64 over K/V as the f16 cache holds them (q and the
    probabilities stay float), also where a cluster's key ranges are empty."""
    n_head, n_kv, hd, _, pos, bs, window = SHORT_CASES[case]
    rng, q, k, v = short_inputs(case)
    y = short_gpu.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)), window=window,
                            fast=True)
    expect = ref_ops.attention(q, ref_ops.kv_round(k, "f16"), ref_ops.kv_round(v, "f16"), pos, n_head, n_kv, hd, window)
    assert rel_err(y, expect) < (3e-3 if case in ("head_dim_80", "past_short", "many") else 1e-4)


def test_attention_short_is_opt_in(gpu):
    """Without EMBER_CUDA_SHORT_ATTN=1 the engine's default-mode decode steps keep the reference-order
    kernel that Llama's take: the same bits as the queries run as one sequence."""
    n_head, n_kv, hd, _, pos, bs, _ = SHORT_CASES["batch"]
    _, q, k, v = short_inputs("batch")
    args = (q, k, v, pos, n_head, n_kv, hd, bs)
    assert_same_bits(gpu.attention(*args, seed=4, fast=True), gpu.attention(*args, seed=4), "fast_attention batch")


@pytest.mark.parametrize("case", ["decode", "batch", "gqa_9_3"])
def test_attention_short_q8_output_same_bits(short_gpu, case):
    """attention_short also writes the q8_1 blocks the O projection's GEMV reads: attention + O
    projection equals, bit for bit, the unfused backend's separate kernels."""
    n_head, n_kv, hd, _, pos, bs, window = SHORT_CASES[case]
    rng, q, k, v = short_inputs(case)
    wo = random_weight(T.Q4_0, 96, n_head * hd, rng)
    args = (q, k, v, pos, n_head, n_kv, hd, bs)
    yf = short_gpu.attention(*args, seed=4, window=window, o_type=int(T.Q4_0), o_weight=wo, fast=True)
    yu = unfused_backend(EMBER_CUDA_SHORT_ATTN="1").attention(*args, seed=4, window=window, o_type=int(T.Q4_0),
                                                              o_weight=wo, fast=True)
    assert_same_bits(yf, yu, f"attention_short + O projection, {case}")


def unfused_backend(**switches):
    """A CUDA backend that launches each op as called (EMBER_CUDA_FUSE=0)."""
    return cuda_backend(EMBER_CUDA_FUSE="0", **switches)


@pytest.mark.parametrize("case", list(ATTN_CASES))
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_attention_q8_output_same_bits(gpu, case, kv_type):
    """The decode attention kernels write their output also as the q8_1 blocks the O projection's
    GEMV reads (no quantize launch between them): attention + O projection equals, bit for bit,
    the unfused backend's separate kernels. Short contexts through the flash kernels too."""
    n_head, n_kv, hd, length, pos, bs = ATTN_CASES[case]
    rng = rng_for("attention_o", case, kv_type)
    q, k, v = attention_inputs(ATTN_CASES[case], rng)
    wo = random_weight(T.Q4_0, 96, n_head * hd, rng)
    fused = cuda_backend(EMBER_CUDA_EXACT_ATTN="0")
    unfused = unfused_backend(EMBER_CUDA_EXACT_ATTN="0")
    args = (q, k, v, pos, n_head, n_kv, hd, bs)
    yf = fused.attention(*args, seed=4, kv_type=kv_type, o_type=int(T.Q4_0), o_weight=wo)
    yu = unfused.attention(*args, seed=4, kv_type=kv_type, o_type=int(T.Q4_0), o_weight=wo)
    assert_same_bits(yf, yu, f"attention + O projection, {case}")


# (type, n_in, n_ff, n_tok): CPU-order rows (<= 2048 wide) and lane-strided ones, one and four
# warps per row (Q8_0 rows of 16384), float weights (no q8_1 output), several tokens.
FFN_CASES = [(T.Q4_0, 256, 512, 1), (T.Q4_0, 4096, 256, 1), (T.Q4_0, 4096, 256, 3), (T.Q5_1, 512, 160, 2),
             (T.Q4_K, 4096, 256, 1), (T.Q6_K, 2304, 256, 1), (T.Q8_0, 16384, 64, 2), (T.F16, 4096, 128, 1)]


@pytest.mark.parametrize("t,n_in,n_ff,n_tok", FFN_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_ffn_fused_same_bits(gpu, t, n_in, n_ff, n_tok, act):
    """The fused feed-forward op as the fused backend runs it (gate and up in one GEMV launch; float
    weights write act(gate) * up from it, the q8_1 formats get it with the q8_1 blocks the down
    projection reads): the same bits as the unfused kernels, and near the float64 reference."""
    rng = rng_for("ffn", t.name, n_in, n_tok, act)
    gate, up = quantized_weight(t, n_ff, n_in, rng), quantized_weight(t, n_ff, n_in, rng)
    down = quantized_weight(t, n_in, n_ff, rng)
    x, res = rng.standard_normal((2, n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    args = (int(t), gate, up, down, n_in, x, norm, 1e-5, res, act)
    y, x_sum = gpu.ffn(*args)
    y_unfused, x_sum_unfused = unfused_backend().ffn(*args)
    assert_same_bits(y, y_unfused, "ffn")
    assert_same_bits(x_sum, x_sum_unfused, "ffn residual sum")
    xn = ref_ops.rmsnorm(x.astype(np.float64) + res, norm, 1e-5)
    g, u = xn @ dequant(t, gate, n_in).T, xn @ dequant(t, up, n_in).T
    ref = ref_ops.gated_act(g, u, act) @ dequant(t, down, n_ff).T
    assert rel_err(y, ref) < 5e-2   # two int8 roundings of the activations


# (type, n_in, q heads, kv heads, head_dim, n_tok): CPU-order rows (SmolLM2's shape), lane-strided
# ones, GQA, several tokens, a K-quant; F16 rows of 4096 (four warps a row) keep the separate kernel.
QKV_CASES = [(T.Q4_1, 576, 9, 3, 64, 1), (T.Q4_0, 4096, 8, 8, 128, 1), (T.Q4_0, 4096, 8, 2, 128, 3),
             (T.Q4_K, 4096, 4, 4, 128, 2), (T.Q8_0, 2048, 4, 2, 64, 8), (T.F16, 4096, 4, 4, 128, 1)]


@pytest.mark.parametrize("t,n_in,n_head,n_kv,hd,n_tok", QKV_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("neox", [False, True])
def test_attn_in_same_bits(gpu, cpu, t, n_in, n_head, n_kv, hd, n_tok, neox):
    """The fused attention input op (norm, Q, K, V projections, rope of q and k, the f16 KV store):
    where the fused backend's Q, K, V GEMV rotates and stores in its epilogue (normal rope), the
    same bits as the unfused kernels; near the CPU backend and the float64 reference."""
    rng = rng_for("qkv", t.name, n_in, n_tok, neox)
    wq, wk, wv = (quantized_weight(t, n * hd, n_in, rng) for n in (n_head, n_kv, n_kv))
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    pos = sorted(int(p) for p in rng.choice(300, n_tok, replace=False))
    args = (int(t), wq, wk, wv, n_in, x, pos, hd, 10000.0, neox, 16, norm)
    names = ("q", "k cache", "v cache")
    fused = gpu.attn_in(*args)[:3]
    for name, a, b in zip(names, fused, unfused_backend().attn_in(*args)[:3]):
        assert_same_bits(a, b, name)
    xn = ref_ops.rmsnorm(x, norm, 1e-5)
    refs = (rope_ref(xn @ dequant(t, wq, n_in).T, pos, n_head, hd, 10000.0, neox),
            rope_ref(xn @ dequant(t, wk, n_in).T, pos, n_kv, hd, 10000.0, neox), xn @ dequant(t, wv, n_in).T)
    for name, a, c, ref in zip(names, fused, cpu.attn_in(*args)[:3], refs):
        assert rel_err(a, c) < 2e-2, name
        assert rel_err(a, ref) < 1.5e-2, name   # int8 activations (q8_1) in the GEMV, f16 cache


# Short contexts on the GPU take the reference-order kernel: the CPU's sums in the CPU's order,
# with glibc's expf. (n_head, n_head_kv, head_dim, kv length, query positions, block_size, window,
# each query its own sequence over the same blocks: a decode step, whose older K/V rows the kernel
# copies before its PDL wait)
EXACT_CASES = {
    "prompt_gqa_9_3": (9, 3, 64, 150, list(range(140, 150)), 16, 0, False),
    "decode_gqa_9_3": (9, 3, 64, 150, [149], 16, 0, False),
    "first_token": (8, 8, 128, 1, [0], 16, 0, False),                 # one key: three CTAs of the cluster empty
    "longest": (8, 8, 128, 512, [511, 300], 16, 0, False),            # four CTAs of 128 keys
    "decode_steps": (4, 2, 128, 300, [299, 10, 63, 128], 16, 0, True),
    "head_dim_80": (4, 2, 80, 90, [89, 3], 16, 0, False),             # three CTAs, the last of 16 dims
    "head_dim_256": (2, 1, 256, 130, [129, 64], 16, 0, True),         # eight CTAs
    "window": (8, 2, 64, 300, [299, 100, 20], 16, 40, True),
    "block_8": (4, 4, 128, 200, [199, 7, 8], 8, 0, False),
}


@pytest.mark.parametrize("sinks", [False, True], ids=["no_sinks", "sinks"])
@pytest.mark.parametrize("clusters", [True, False], ids=["cluster", "one_cta"])
@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_attention_matches_cpu(cpu, case, clusters, sinks):
    """Both forms of the kernel (a cluster of CTAs a head on Hopper; one CTA a head before it, or
    with EMBER_CUDA_EXACT_CLUSTER=0) give the CPU backend's bits, with per-head sink logits too."""
    gpu = cuda_backend(EMBER_CUDA_EXACT_CLUSTER="1" if clusters else "0")
    n_head, n_kv, hd, length, pos, bs, window, steps = EXACT_CASES[case]
    rng = rng_for("attention_cpu", case + ("-sinks" if sinks else ""))
    q = rng.standard_normal((len(pos), n_head * hd)).astype(np.float32)
    k, v = rng.standard_normal((2, length, n_kv * hd)).astype(np.float32)
    s = (np.log(min(length, window or length)) + rng.uniform(-3, 3, n_head)).astype(np.float32) if sinks else None
    args = (q, k, v, pos, n_head, n_kv, hd, bs)
    yc = cpu.attention(*args, seed=3, window=window, sinks=s)
    assert_same_bits(gpu.attention(*args, seed=5, window=window, fast=steps, sinks=s), yc, case)


@pytest.mark.parametrize("clusters", [True, False], ids=["cluster", "one_cta"])
@pytest.mark.parametrize("case", ["prompt_gqa_9_3", "decode_steps", "head_dim_256", "window"])
def test_attention_softcap_matches_cpu(cpu, case, clusters):
    """Soft-capped scores (AttentionShape::softcap, Gemma 2) keep the reference-order kernel on the
    CPU's bits: the same tanh from glibc's expf. Queries scaled up so the cap bends most scores."""
    gpu = cuda_backend(EMBER_CUDA_EXACT_CLUSTER="1" if clusters else "0")
    n_head, n_kv, hd, length, pos, bs, window, steps = EXACT_CASES[case]
    rng = rng_for("attention_cpu_softcap", case)
    q = (4 * rng.standard_normal((len(pos), n_head * hd))).astype(np.float32)
    k, v = rng.standard_normal((2, length, n_kv * hd)).astype(np.float32)
    cap = float(rng.uniform(2.0, 6.0))
    args = (q, k, v, pos, n_head, n_kv, hd, bs)
    yc = cpu.attention(*args, seed=3, window=window, softcap=cap)
    assert_same_bits(gpu.attention(*args, seed=5, window=window, fast=steps, softcap=cap), yc, case)


# Heads of 512 (Gemma 4's global layers) take the tiled kernel's wide form at every length and batch
# (cuda/kernel_choice.h): against the CPU backend over the same caches (f16 q and probabilities on the
# GPU), with GQA (8 q heads a kv head as in the 31B; 3 leave a CTA's fourth slot empty), windows,
# soft-capping, engine steps, prompts and key ranges split over CTAs. (n_head, n_head_kv, kv length,
# query positions, block_size, window, softcap, each query its own sequence over the same blocks)
HD512_CASES = {
    "hd512_decode": (8, 1, 150, [149], 16, 0, 0.0, False),
    "hd512_long_decode_gqa_8": (32, 4, 1500, [1499], 16, 0, 0.0, False),
    "hd512_steps": (8, 2, 700, [699, 100, 300], 16, 0, 0.0, True),
    "hd512_prompt": (4, 4, 100, list(range(100)), 16, 0, 0.0, False),
    "hd512_prompt_gqa_3": (6, 2, 90, list(range(20, 90)), 16, 0, 0.0, False),
    "hd512_window_prompt": (8, 2, 300, list(range(100, 300)), 16, 64, 0.0, False),
    "hd512_window_steps": (8, 2, 600, [599, 30, 200], 16, 40, 0.0, True),
    "hd512_softcap_decode": (8, 1, 700, [699], 16, 0, 3.0, False),
    "hd512_softcap_window_prompt": (8, 2, 200, list(range(120, 200)), 16, 50, 3.0, False),
}


@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "bf16"])
@pytest.mark.parametrize("case", list(HD512_CASES))
def test_attention_hd512_matches_cpu(gpu, cpu, case, kv_type):
    n_head, n_kv, length, pos, bs, window, cap, steps = HD512_CASES[case]
    rng = rng_for("attention_hd512", case, kv_type)
    q = ((4.0 if cap else 1.0) * rng.standard_normal((len(pos), n_head * 512))).astype(np.float32)
    k, v = rng.standard_normal((2, length, n_kv * 512)).astype(np.float32)
    args = (q, k, v, pos, n_head, n_kv, 512, bs)
    yc = cpu.attention(*args, seed=3, kv_type=kv_type, window=window, softcap=cap)
    yg = gpu.attention(*args, seed=5, kv_type=kv_type, window=window, fast=steps, softcap=cap)
    assert rel_err(yg, yc) < 3e-3, f"{case} {kv_type}"


# End-to-end on the real SmolLM2-135M (Q4_1, GQA 9/3, tied Q8_0 head): every block on the GPU,
# and a split (the first 18 blocks on the CPU, the last 12 and the head on the GPU), teacher-forced
# against llama.cpp's greedy text. (Decode steps, eager then captured and replayed as CUDA graphs,
# are checked against the CPU's logits bit for bit in test_smollm2_logits_gpu_vs_cpu.)
SPLITS = {"all": -1, "split12": 12}


@pytest.mark.parametrize("split", list(SPLITS))
def test_smollm2_greedy_gpu(gpu, smollm2_path, split):
    from conftest import assert_follows_llama_cpp_greedy
    from ember.llama import Llama

    with Llama(smollm2_path, n_ctx=512, n_gpu_layers=SPLITS[split], verbose=False) as llm:
        assert_follows_llama_cpp_greedy(llm, f"{split} ")


@pytest.mark.parametrize("split", list(SPLITS))
def test_smollm2_perplexity_gpu(gpu, smollm2_path, split):
    import io
    from conftest import REFERENCE
    from ember.perplexity import perplexity

    model = _ember.Model(smollm2_path, n_gpu_layers=SPLITS[split])
    log = io.StringIO()
    ppl = perplexity(model, (REFERENCE / "apache-2.0.txt").read_bytes(), 256, 4, out=log)
    print(log.getvalue())
    assert abs(ppl - 17.7438) / 17.7438 < 0.01


def test_smollm2_logits_gpu_vs_cpu(gpu, smollm2_path):
    """Prompt logits, then 12 single-token steps (graph capture and replays) vs the CPU: the same
    bits on an AVX-512 host. Elsewhere the bounds are the CPU's own spread: on this prompt the CPU's
    AVX-512 and AVX2 dot products
    (the same arithmetic summed in another order) differ by 0.5-3.8% per step, 1.5% on average,
    because a last-bit difference flips some 8-bit activation roundings and the flips compound
    over 30 layers. Real defects (a wrong rope, a stale KV row) give errors of order 1."""
    rng = rng_for("logits")
    prompt = [int(t) for t in rng.integers(0, 49152, 40)]
    steps = [int(t) for t in rng.integers(0, 49152, 12)]
    rows = {}
    for name, ngl in (("cpu", 0), ("gpu", -1)):
        ctx = _ember.Context(_ember.Model(smollm2_path, n_gpu_layers=ngl), n_ctx=128, n_batch=64, n_threads=4)
        ctx.eval(prompt, logits_all=False)
        out = [np.array(ctx.logits(-1))]
        for t in steps:
            ctx.eval([t], logits_all=False)
            out.append(np.array(ctx.logits(-1)))
        rows[name] = np.stack(out)
    errs = [rel_err(g.astype(np.float64), c.astype(np.float64)) for c, g in zip(rows["cpu"], rows["gpu"])]
    print("gpu vs cpu rel err per step:", " ".join(f"{e:.4f}" for e in errs))
    if SAME_BITS_AS_CPU:   # every op rounds as the CPU's (the tests above), so the logits do too
        assert_same_bits(rows["gpu"], rows["cpu"], "SmolLM2 logits")
    assert max(errs) < 6e-2 and np.mean(errs) < 2.5e-2
    for i, (c, g) in enumerate(zip(rows["cpu"], rows["gpu"])):
        assert np.argmax(g) == np.argmax(c) or np.sort(c)[-1] - np.sort(c)[-2] < 0.1, f"step {i}"


# Partial offload with streaming: batches of >= 32 tokens run the CPU blocks on the GPU on weights
# copied there per step (raw blocks re-laid out by a kernel) and KV copied in and back out. A small
# synthetic llama whose weights rotate through every format, 4 blocks of which 2 on the GPU.
STREAM_TYPES = [T.Q4_0, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_1, T.Q6_K, T.Q4_K, T.F16]


def write_synthetic_model(path, rng, n_layer=4, types=STREAM_TYPES, output_type=T.Q8_0):
    """n_embd 256 (4 heads of 64, 2 KV heads), n_ff 512, a 512-token SentencePiece vocab; the
    matrices rotate through `types`."""
    import gguf
    n_embd, n_ff, n_vocab = 256, 512, 512
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n_vocab)])
    w.add_token_scores([0.0] * n_vocab)

    def matrix(name, t, n_out, n_in, scale=0.5):
        w.add_tensor(name, quantized_weight(t, n_out, n_in, rng, scale), raw_dtype=t)

    def norm(name):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    shapes = [("attn_q", n_embd, n_embd), ("attn_k", 128, n_embd), ("attn_v", 128, n_embd),
              ("attn_output", n_embd, n_embd), ("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd),
              ("ffn_down", n_embd, n_ff)]
    for l in range(n_layer):
        norm(f"blk.{l}.attn_norm.weight")
        norm(f"blk.{l}.ffn_norm.weight")
        for i, (name, n_out, n_in) in enumerate(shapes):
            matrix(f"blk.{l}.{name}.weight", types[(i + l) % len(types)], n_out, n_in)
    norm("output_norm.weight")
    matrix("output.weight", output_type, n_vocab, n_embd, scale=3.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_sequence(path, ngl, n_batch, tokens, kv_type="f16", type_v=None):
    """Last-token logits after each eval of `tokens` (a list of token lists); kv_type is K's type
    (and V's unless type_v is given)."""
    ctx = _ember.Context(_ember.Model(str(path), n_gpu_layers=ngl, verbose=True), n_ctx=160, n_batch=n_batch,
                         n_threads=4, type_k=kv_type, type_v=type_v or kv_type)
    out = []
    for toks in tokens:
        ctx.eval(toks, logits_all=False)
        out.append(np.array(ctx.logits(-1), dtype=np.float64))
    return np.stack(out)


def test_streamed_partial_offload(gpu, tmp_path, capfd):
    """A 40-token prompt (streamed: integer GEMV path), 4 decode steps (the CPU blocks on the CPU read
    the KV the streamed blocks wrote), a 70-token batch (streamed: cuBLAS path, uploading KV written
    by CPU decode steps), 3 decode steps; against all-CPU, all-GPU and the unstreamed split."""
    rng = rng_for("stream")
    path = tmp_path / "synthetic.gguf"
    write_synthetic_model(path, rng)
    tok = lambda n: [int(t) for t in rng.integers(3, 512, n)]
    seq = [tok(40)] + [tok(1) for _ in range(4)] + [tok(70)] + [tok(1) for _ in range(3)]
    configs = {   # name: (n_gpu_layers, n_batch, switches)
        "cpu": (0, 128, {}),
        "gpu": (-1, 128, {}),
        "split": (2, 128, {"EMBER_STREAM": "0"}),
        "streamed": (2, 128, {}),
        "bounce": (2, 128, {"EMBER_STREAM_PIN": "0"}),   # pinned bounce buffers instead of the pinned mapping
        "streamed_b32": (2, 32, {}),   # 40 = 32 streamed + 8 on the CPU blocks, reading the streamed KV
    }
    rows, log = {}, []
    for name, (ngl, n_batch, switches) in configs.items():
        capfd.readouterr()
        with overridden(**{"EMBER_STREAM": "1", "EMBER_STREAM_PIN": "1", **switches}):
            rows[name] = run_sequence(path, ngl, n_batch, seq)
        err = capfd.readouterr().err
        log.append(f"{name}: {err.strip()}")
        assert ("stream to GPU" in err) == (ngl == 2 and switches.get("EMBER_STREAM") != "0"), err
    per_step = lambda a, b: [rel_err(x, y) for x, y in zip(rows[a], rows[b])]
    errs = {f"{a} vs {b}": per_step(a, b) for a, b in [
        ("streamed", "gpu"), ("bounce", "streamed"), ("gpu", "cpu"), ("split", "cpu"), ("streamed", "cpu"),
        ("streamed_b32", "cpu"), ("streamed", "split"), ("streamed_b32", "split")]}
    with capfd.disabled():
        print("\n" + "\n".join(log + [f"{k}: " + " ".join(f"{e:.1e}" for e in v) for k, v in errs.items()]))
    # The first prompt of the streamed split runs exactly the all-GPU model's kernels on the same bytes.
    assert errs["streamed vs gpu"][0] < 1e-5
    assert max(errs["bounce vs streamed"]) < 1e-5   # the same arithmetic, another copy path
    for name in ("gpu", "split", "streamed", "streamed_b32"):
        assert max(errs[f"{name} vs cpu"]) < 3e-2, name
        for i, (g, c) in enumerate(zip(rows[name], rows["cpu"])):
            assert np.argmax(g) == np.argmax(c) or np.sort(c)[-1] - np.sort(c)[-2] < 0.1, f"{name} step {i}"
    # Decode steps read the KV that streamed blocks wrote (another prompt's KV gives ~0.1 here).
    assert max(errs["streamed vs split"]) < 1e-2
    assert max(errs["streamed_b32 vs split"]) < 1e-2


def test_float_model_matches_cpu(gpu, tmp_path):
    """All-F16 matrices and head. Decode batches (<= 8 tokens) run gate and up as one GEMV that
    writes silu(gate) * up; unfused (EMBER_CUDA_FUSE=0) the same values come out of separate
    kernels."""
    rng = rng_for("f16 model")
    path = tmp_path / "f16.gguf"
    write_synthetic_model(path, rng, types=[T.F16], output_type=T.F16)
    seq = [[int(t) for t in rng.integers(3, 512, n)] for n in (20, 1, 3, 1, 8, 1, 1)]
    cpu_rows, gpu_rows = run_sequence(path, 0, 128, seq), run_sequence(path, -1, 128, seq)
    with overridden(EMBER_CUDA_FUSE="0"):
        unfused_rows = run_sequence(path, -1, 128, seq)
    errs = [rel_err(g, c) for g, c in zip(gpu_rows, cpu_rows)]
    fusion = [rel_err(g, u) for g, u in zip(gpu_rows, unfused_rows)]
    print("f16 model gpu vs cpu per step: " + " ".join(f"{e:.1e}" for e in errs))
    print("fused vs unfused per step: " + " ".join(f"{e:.1e}" for e in fusion))
    assert max(errs) < 1e-2
    assert max(fusion) < 1e-5


def test_q8_kv_model_matches_cpu(gpu, tmp_path):
    """A q8_0 KV cache: all-GPU and the streamed split against the CPU with the same cache type."""
    rng = rng_for("q8 kv model")
    path = tmp_path / "synthetic.gguf"
    write_synthetic_model(path, rng)
    seq = [[int(t) for t in rng.integers(3, 512, n)] for n in (40, 1, 1, 1, 70, 1, 1)]
    cpu_rows = run_sequence(path, 0, 128, seq, kv_type="q8_0")
    for ngl in (-1, 2):
        errs = [rel_err(g, c) for g, c in zip(run_sequence(path, ngl, 128, seq, kv_type="q8_0"), cpu_rows)]
        print(f"q8_0 KV ngl {ngl} gpu vs cpu per step: " + " ".join(f"{e:.1e}" for e in errs))
        assert max(errs) < 3e-2


@pytest.mark.parametrize("type_k, type_v", [("q8_0", "f16"), ("f16", "q8_0")])
def test_mixed_kv_model_matches_cpu(gpu, tmp_path, type_k, type_v):
    """One q8_0 and one f16 cache (attn_in's rope then a store per cache; attention over an f16
    copy of the q8_0 one): all-GPU, decode graphs and the streamed split against the CPU."""
    rng = rng_for("mixed kv model", type_k)
    path = tmp_path / "synthetic.gguf"
    write_synthetic_model(path, rng)
    seq = [[int(t) for t in rng.integers(3, 512, n)] for n in (40, 1, 1, 1, 70, 1, 1)]
    cpu_rows = run_sequence(path, 0, 128, seq, type_k, type_v)
    for ngl in (-1, 2):
        errs = [rel_err(g, c) for g, c in zip(run_sequence(path, ngl, 128, seq, type_k, type_v), cpu_rows)]
        print(f"K {type_k} V {type_v} ngl {ngl} gpu vs cpu per step: " + " ".join(f"{e:.1e}" for e in errs))
        assert max(errs) < 3e-2


def test_bad_input_raises(gpu):
    rng = rng_for("bad")
    w = np.ascontiguousarray(random_weight(T.Q4_K, 4, 256, rng)[:, :100])
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with pytest.raises(ValueError):   # rows shorter than 256 Q4_K elements
        gpu.matmul(int(T.Q4_K), w, 256, x)
    q, kv = rng.standard_normal((1, 520)).astype(np.float32), rng.standard_normal((4, 520)).astype(np.float32)
    with pytest.raises(ValueError, match="head_dim 520 is above 512"):   # beyond the widest head the kernels take
        gpu.attention(q, kv, kv, [3], 1, 1, 520, 16)


# ---- the mixture's experts (cuda/moe_route.cu, cuda/moe_gemv.cu) ----

def moe_inputs(t, n_embd, n_ff, n_exp, n_tok, rng, biases=False):
    """Stacked experts of type t (outputs of about 1 for unit inputs), a router whose logits spread
    over a few units, normed-like rows x, and optional expert biases."""
    gate = np.concatenate([quantized_weight(t, n_ff, n_embd, rng) for _ in range(n_exp)])
    up = np.concatenate([quantized_weight(t, n_ff, n_embd, rng) for _ in range(n_exp)])
    down = np.concatenate([quantized_weight(t, n_embd, n_ff, rng) for _ in range(n_exp)])
    router = (rng.standard_normal((n_exp, n_embd)) * 2 / np.sqrt(n_embd)).astype(np.float32)
    x = rng.standard_normal((n_tok, n_embd)).astype(np.float32)
    kw = {}
    if biases:
        kw = dict(router_bias=rng.standard_normal(n_exp).astype(np.float32) * 0.5,
                  gate_bias=rng.standard_normal(n_exp * n_ff).astype(np.float32) * 0.1,
                  up_bias=rng.standard_normal(n_exp * n_ff).astype(np.float32) * 0.1,
                  down_bias=rng.standard_normal(n_exp * n_embd).astype(np.float32) * 0.1)
    return (int(t), gate, up, down, router, x), kw


def moe_reference(t, gate, up, down, router, x, n_used, gating, norm_topk, scale, act, router_bias=None,
                  gate_bias=None, up_bias=None, down_bias=None):
    """The experts in float64 from the dequantized weights: route, run each token's experts, sum."""
    n_exp, n_embd = router.shape
    n_ff = gate.shape[0] // n_exp
    g_all, u_all = dequant(T(t), gate, n_embd), dequant(T(t), up, n_embd)
    d_all = dequant(T(t), down, n_ff)
    logits = x.astype(np.float64) @ router.astype(np.float64).T
    if router_bias is not None:
        logits += router_bias
    out = np.zeros((x.shape[0], n_embd))
    for i, lg in enumerate(logits):
        if gating == "sigmoid":
            score = 1 / (1 + np.exp(-lg))
            chosen = np.argsort(-score, kind="stable")[:n_used]
            w = score[chosen]
        else:
            chosen = np.argsort(-lg, kind="stable")[:n_used]
            if gating == "softmax":
                p = np.exp(lg - lg.max())
                w = (p / p.sum())[chosen]
            else:
                w = np.exp(lg[chosen] - lg[chosen].max())
                w /= w.sum()
        if norm_topk:
            w = w / w.sum()
        w = w * scale
        for e, we in zip(chosen, w):
            rows = slice(e * n_ff, (e + 1) * n_ff)
            g, u = g_all[rows] @ x[i], u_all[rows] @ x[i]
            if gate_bias is not None:
                g, u = g + gate_bias[rows], u + up_bias[rows]
            h = ref_ops.gated_act(g, u, act) if act != "swiglu_clamped" else swiglu_clamped(g, u)
            y = d_all[e * n_embd:(e + 1) * n_embd] @ h
            if down_bias is not None:
                y = y + down_bias[e * n_embd:(e + 1) * n_embd]
            out[i] += we * y
    return out


def swiglu_clamped(g, u):
    g = np.minimum(g, 7.0)
    return g / (1 + np.exp(-1.702 * g)) * (np.clip(u, -7.0, 7.0) + 1)


MOE_TYPES = [T.Q4_K, T.Q6_K, T.Q5_K, T.Q8_0, T.Q4_0, T.MXFP4, T.F16]


@pytest.mark.parametrize("t", MOE_TYPES, ids=lambda v: v.name)
def test_moe_paths_agree(gpu, t):
    """The one-token path (a GEMV a (token, expert) pair, the down projection summing a token's
    experts) and the grouped path (tokens grouped by expert on the device, chunks of one expert's
    tokens) give the same experts' sums within float rounding, both near the float64 reference and
    near the default composition of primitives (Backend::moe)."""
    rng = rng_for("moe_paths", t.name)
    n_embd, n_ff, n_exp, n_used = 256, 512, 16, 4
    args, _ = moe_inputs(t, n_embd, n_ff, n_exp, 3, rng)
    kw = dict(gating="softmax", norm_topk=True)
    pairs = gpu.moe(*args, n_used, **kw)
    grouped = gpu.moe(*args, n_used, **kw, n_seq=1, batch_invariant=True)
    composed = gpu.moe(*args, n_used, **kw, composed=True)
    ref = moe_reference(*args, n_used, "softmax", True, 1.0, "silu")
    assert rel_err(pairs, grouped) < 1e-5
    assert rel_err(grouped, composed) < 1e-4
    assert rel_err(pairs, ref) < (1e-3 if t == T.F16 else 5e-2)


@pytest.mark.parametrize("n_tok", [5, 17, 64, 200])
def test_moe_grouped_batches(gpu, n_tok):
    """Prompt-sized batches take the grouped path: near the default composition and the float64
    reference; in deterministic mode each token's bits do not depend on the rest of the batch."""
    rng = rng_for("moe_grouped", n_tok)
    n_embd, n_ff, n_exp, n_used = 256, 256, 32, 8
    args, _ = moe_inputs(T.Q4_K, n_embd, n_ff, n_exp, n_tok, rng)
    got = gpu.moe(*args, n_used)
    assert rel_err(got, gpu.moe(*args, n_used, composed=True)) < 5e-3   # (experts of > 64 tokens: f16 cuBLAS)
    assert rel_err(got, moe_reference(*args, n_used, "softmax", False, 1.0, "silu")) < 5e-2
    every = gpu.moe(*args, n_used, n_seq=1, batch_invariant=True)
    one = args[:5] + (args[5][2:3],)
    assert_same_bits(every[2:3], gpu.moe(*one, n_used, n_seq=1, batch_invariant=True), "token 2 alone")


@pytest.mark.parametrize("gating,norm_topk,scale,act", [
    ("softmax", False, 1.0, "silu"),          # Mixtral-style weights, not renormalized
    ("topk_softmax", False, 1.0, "swiglu_clamped"),   # gpt-oss
    ("sigmoid", True, 2.5, "gelu_tanh"),
])
@pytest.mark.parametrize("n_tok", [1, 9])
def test_moe_gating_and_biases(gpu, gating, norm_topk, scale, act, n_tok):
    """Each gating with a router bias and the experts' biases, on both paths, near the float64
    reference (the routing weights are the CPU's arithmetic)."""
    rng = rng_for("moe_gating", gating, act, n_tok)
    args, kw = moe_inputs(T.Q8_0, 128, 256, 8, n_tok, rng, biases=True)
    got = gpu.moe(*args, 2, gating=gating, norm_topk=norm_topk, weight_scale=scale, act=act, **kw)
    ref = moe_reference(*args, 2, gating, norm_topk, scale, act, **kw)
    assert rel_err(got, ref) < 2e-2
    composed = gpu.moe(*args, 2, gating=gating, norm_topk=norm_topk, weight_scale=scale, act=act, composed=True, **kw)
    assert rel_err(got, composed) < 1e-4


@pytest.mark.parametrize("n_tok", [1, 6])
def test_moe_graph_replay_equals_eager(gpu, n_tok):
    """The op has no host synchronisation: recorded as a step graph (each token its own sequence,
    an engine decode step) and replayed, it writes what the eager run writes, bit for bit."""
    rng = rng_for("moe_graph", n_tok)
    args, _ = moe_inputs(T.Q4_K, 256, 256, 16, n_tok, rng)
    eager = gpu.moe(*args, 4, n_seq=n_tok)
    replayed = gpu.moe(*args, 4, n_seq=n_tok, graph_steps=4)
    assert_same_bits(replayed, eager, "replayed moe")


def test_moe_bad_input(gpu):
    rng = rng_for("moe_bad")
    args, _ = moe_inputs(T.Q8_0, 128, 64, 4, 2, rng)
    with pytest.raises(ValueError, match="n_used 5 must lie in 1..4"):
        gpu.moe(*args, 5)
    with pytest.raises(ValueError, match="gating must be"):
        gpu.moe(*args, 2, gating="argmax")
    with pytest.raises(ValueError, match="down must be"):
        gpu.moe(*args[:3], args[3][:-1], *args[4:], 2)


@pytest.mark.parametrize("n_tok", [2, 12])
@pytest.mark.parametrize("gated", [False, True], ids=["shared", "gated_shared"])
def test_moe_ffn_shared_expert(gpu, n_tok, gated):
    """moe_ffn (the residual add and rmsnorm, then the experts) with a shared expert, with and without
    its sigmoid gate, on both paths: near the default composition and the float64 reference."""
    rng = rng_for("moe_shared", n_tok, gated)
    n_embd, n_ffs = 256, 384
    args, _ = moe_inputs(T.Q8_0, n_embd, 128, 8, n_tok, rng)
    sg, su = quantized_weight(T.Q8_0, n_ffs, n_embd, rng), quantized_weight(T.Q8_0, n_ffs, n_embd, rng)
    sd = quantized_weight(T.Q8_0, n_embd, n_ffs, rng)
    sh = dict(shared_gate=sg, shared_up=su, shared_down=sd)
    if gated:
        sh["shared_gate_inp"] = (rng.standard_normal(n_embd) / 8).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_embd).astype(np.float32)
    res = rng.standard_normal((n_tok, n_embd)).astype(np.float32)
    got = gpu.moe(*args, 2, norm=norm, residual=res, **sh)
    assert rel_err(got, gpu.moe(*args, 2, norm=norm, residual=res, composed=True, **sh)) < 1e-4
    xn = ref_ops.rmsnorm(args[5].astype(np.float64) + res, norm, 1e-5)
    ref = moe_reference(*args[:5], xn, 2, "softmax", False, 1.0, "silu")
    shared = ref_ops.gated_act(xn @ dequant(T.Q8_0, sg, n_embd).T, xn @ dequant(T.Q8_0, su, n_embd).T, "silu")
    shared = shared @ dequant(T.Q8_0, sd, n_ffs).T
    if gated:
        shared *= 1 / (1 + np.exp(-(xn @ sh["shared_gate_inp"].astype(np.float64))))[:, None]
    assert rel_err(got, ref + shared) < 2e-2
