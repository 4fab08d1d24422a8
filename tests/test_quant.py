"""Quant block formats and CPU dot products (_ember_test's quant kernels, _ember.type_info)
against the gguf package's numpy reference (gguf.quants) and against each other (SIMD kernel vs scalar reference)."""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
import gguf
import gguf.quants

from ember import _ember
from conftest import ROOT, at_simd_level, kernel_module, rng_for, simd_levels

E = kernel_module()

ALL_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K, T.MXFP4, T.IQ4_NL, T.IQ4_XS, T.IQ3_S,
             T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.NVFP4]
LOW_BIT = [T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.NVFP4]
LEGACY_QUANTIZED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTIZED = [T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.fixture(params=simd_levels("avx2", "scalar"))
def level(request):
    """The SIMD level the kernels run at: this machine's, then each lower one (EMBER_SIMD, set in-process)."""
    with at_simd_level(request.param):
        yield request.param

# Byte offsets of the fp16 scale fields inside one block (Q8_K: an fp32 scale at 0).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q8_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.IQ3_S: [0], T.IQ3_XXS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0],
    T.IQ1_S: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}


def set_iq1_m_d(raw, d):
    """IQ1_M's fp16 d lives in the top nibbles of its 4 scale words (bytes 48-55): nibble w in word w."""
    bits = d.astype(np.float16).view(np.uint16)
    for w in range(4):
        hi = raw[:, 49 + 2 * w]
        raw[:, 49 + 2 * w] = (hi & 0x0F) | (((bits >> (4 * w)) & 0x0F) << 4).astype(np.uint8)


def block_size(t):
    # gguf-py still lists Q8_1 with the old fp32 d and s (40 bytes); ggml's block_q8_1 holds
    # fp16 d and s (36 bytes). Q8_1 only exists as an activation format, never in files.
    return (32, 36) if t == T.Q8_1 else GGML_QUANT_SIZES[t]


def random_blocks(t, n_blocks, rng):
    """Random bytes with finite random scales: every bit pattern of the quants is exercised."""
    elems, nbytes = block_size(t)
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    if t == T.Q8_K:
        d = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks)).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    for off in F16_FIELDS.get(t, []):
        d = (rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if t == T.MXFP4:
        # e8m0 exponents of the scales 2^-14 .. 2^0 (the fp16 scales' range above)
        raw[:, 0] = rng.integers(128 - 14, 129, n_blocks)
    if t == T.IQ1_M:
        set_iq1_m_d(raw, rng.uniform(-1, 1, n_blocks) * 10.0 ** rng.uniform(-4, 0, n_blocks))
    if t in (T.F16, T.BF16, T.F32):
        # float weights: finite values of mixed magnitude
        vals = rng.standard_normal(n_blocks) * 10.0 ** rng.uniform(-3, 1, n_blocks)
        dtype = {T.F32: np.float32, T.F16: np.float16}.get(t)
        if t == T.BF16:
            raw = (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        else:
            raw = vals.astype(dtype).view(np.uint8)
    return raw.reshape(-1)


def test_type_info_and_simd_level():
    for t in ALL_TYPES:
        info = _ember.type_info(int(t))
        assert info["name"] == t.name
        assert (info["block_elems"], info["block_bytes"]) == block_size(t)
    assert E.vec_dot_type(int(T.Q4_1)) == int(T.Q8_1)
    assert E.vec_dot_type(int(T.Q4_0)) == int(T.Q8_0)
    assert E.vec_dot_type(int(T.Q6_K)) == int(T.Q8_K)
    assert E.vec_dot_type(int(T.F16)) == int(T.F32)
    assert E.simd_level() in ("avx512", "avx2", "neon", "scalar")


def test_simd_level_follows_the_switch(level):
    assert E.simd_level() == level


@pytest.mark.parametrize("t", [t for t in ALL_TYPES if t not in (T.Q8_1, T.Q8_K)], ids=lambda t: t.name)
def test_dequantize_bit_exact_vs_gguf(t):
    rng = rng_for("dequantize", t.name)
    elems, nbytes = block_size(t)
    for n_blocks in (1, 3, 64):
        raw = random_blocks(t, n_blocks, rng)
        ours = E.dequantize(int(t), raw, n_blocks * elems)
        ref = gguf.quants.dequantize(raw.reshape(1, -1), t).reshape(-1).astype(np.float32)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def extreme_scale_blocks(t, rng):
    """Random quants under the extreme scales of each table type: every e8m0 exponent of MXFP4 (subnormal
    2^-128 up to 2^127, whose values overflow to inf), and for IQ4_NL / IQ4_XS the largest, smallest normal
    and subnormal fp16 scales of both signs, and zero (the grid, 1-bit and ternary types likewise); NVFP4
    with every one of the 256 e4m3 scale bytes (subnormals, 0x7f and bit 7 set among them)."""
    elems, nbytes = block_size(t)
    if t == T.MXFP4:
        raw = rng.integers(0, 256, size=(256, nbytes), dtype=np.uint8)
        raw[:, 0] = np.arange(256)
        return raw.reshape(-1)
    if t == T.NVFP4:
        raw = rng.integers(0, 256, size=(64, nbytes), dtype=np.uint8)
        raw[:, 0:4] = np.arange(256).reshape(64, 4)
        return raw.reshape(-1)
    scales = np.array([65504, -65504, 6.1035e-05, -6.1035e-05, 5.96e-08, -5.96e-08, 0.0, 1.0], dtype=np.float16)
    raw = rng.integers(0, 256, size=(scales.size, nbytes), dtype=np.uint8)
    if t == T.IQ1_M:
        set_iq1_m_d(raw, scales)
    else:
        off = F16_FIELDS[t][0]
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("t", [T.MXFP4, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S]
                         + LOW_BIT, ids=lambda t: t.name)
def test_dequantize_extreme_scales_bit_exact_vs_gguf(t):
    rng = rng_for("dequantize extremes", t.name)
    raw = extreme_scale_blocks(t, rng)
    n = raw.size // block_size(t)[1] * block_size(t)[0]
    ours = E.dequantize(int(t), raw, n)
    with np.errstate(over="ignore"):
        ref = gguf.quants.dequantize(raw.reshape(1, -1), t).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", [T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_dequantize_activation_formats(t):
    # gguf has no Q8_1 / Q8_K code: the formula is value = d * q (numpy reference below).
    rng = rng_for("dequantize", t.name)
    elems, nbytes = block_size(t)
    raw = random_blocks(t, 5, rng).reshape(5, nbytes)
    if t == T.Q8_1:
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = raw[:, 4:36].view(np.int8).astype(np.float32)
    else:
        d = raw[:, 0:4].copy().view(np.float32)
        q = raw[:, 4:260].view(np.int8).astype(np.float32)
    ref = (q * d).reshape(-1)
    ours = E.dequantize(int(t), raw.reshape(-1), 5 * elems)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


def float_rows(rng, n):
    """Test distributions, each n values (n a multiple of 256): normal, uniform, heavy tails
    with outliers, zeros mixed in (one all-zero block), constant blocks, tiny and huge values."""
    rows = {
        "normal": rng.standard_normal(n),
        "uniform": rng.uniform(-3, 5, n),
        "laplace_outliers": rng.laplace(0, 0.05, n) * np.where(rng.random(n) < 0.01, 100.0, 1.0),
        "positive": rng.uniform(0.5, 2.0, n),
        "tiny": rng.standard_normal(n) * 1e-6,
        "huge": rng.standard_normal(n) * 3e3,
    }
    z = rng.standard_normal(n)
    z[rng.random(n) < 0.3] = 0.0
    z[32:64] = 0.0
    z[256:512] = 0.0
    rows["zeros"] = z
    c = rng.standard_normal(n)
    c[64:96] = 1.25
    c[96:128] = -0.75
    rows["constant_blocks"] = c
    return {k: v.astype(np.float32) for k, v in rows.items()}


@pytest.mark.parametrize("t", LEGACY_QUANTIZED + [T.MXFP4, T.TQ1_0, T.TQ2_0], ids=lambda t: t.name)
def test_quantize_bit_exact_vs_gguf(t):
    rng = rng_for("quantize", t.name)
    for name, x in float_rows(rng, 1024).items():
        ours = E.quantize(int(t), x)
        ref = gguf.quants.quantize(x.reshape(4, -1), t).reshape(-1)
        assert ours.dtype == np.uint8
        np.testing.assert_array_equal(ours, ref, err_msg=f"{t.name} on {name}")


def test_mxfp4_quantize_ties_and_binade_edges_vs_gguf():
    """MXFP4's quantizer at its edges, byte for byte with gguf's: values exactly halfway between two
    e2m1 steps (the first nearest table entry wins), block maxima at and just below powers of two
    (the exponent's floor(log2)), and values far below the block's largest, which round to zero."""
    rng = rng_for("quantize", "MXFP4 edges")
    steps = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32) / 2
    mids = (steps[:-1] + steps[1:]) / 2
    rows = []
    for k in (-20, -3, 0, 1, 7):
        scale = np.float32(2.0 ** k)
        ties = np.concatenate([mids, -mids, steps, -steps, [6.0, -6.0], rng.uniform(-6, 6, 8)]).astype(np.float32)
        rows.append(rng.permutation(ties[:32]) * scale)
        edge = rng.uniform(-1, 1, 32).astype(np.float32) * scale
        edge[rng.integers(32)] = np.nextafter(np.float32(4.0), np.float32(0)) * scale
        rows.append(edge)
        wide = (rng.standard_normal(32) * 1e-4).astype(np.float32) * scale
        wide[rng.integers(32)] = 5.0 * scale
        rows.append(wide)
    x = np.concatenate(rows).astype(np.float32)
    want = gguf.quants.quantize(x.reshape(1, -1), T.MXFP4).reshape(-1)
    np.testing.assert_array_equal(E.quantize(int(T.MXFP4), x), want)


def test_quantize_float_types_vs_numpy_and_gguf():
    rng = rng_for("quantize", "F16/BF16")
    xs = list(float_rows(rng, 512).values())
    # every float32 bit pattern class: subnormals, halfway cases, inf, NaN, overflow to inf
    bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    xs.append(bits.view(np.float32))
    # exact ties between two fp16 neighbours: an fp16 value plus half its last mantissa step
    h = rng.integers(0, 0x7BFF, size=4096, dtype=np.uint16) | (rng.integers(0, 2, 4096, dtype=np.uint16) << 15)
    ties = h.view(np.float16).astype(np.float32).view(np.uint32) + np.uint32(0x1000)
    xs.append(ties.view(np.float32))
    xs.append(np.array([65504, 65519.99, 65520, 1e-8, 2.0**-25, 2.0**-24 * 1.5, -0.0, np.inf, -np.inf],
                       dtype=np.float32))
    for x in xs:
        f16 = E.quantize(int(T.F16), x).view(np.uint16)
        with np.errstate(all="ignore"):
            ref16 = x.astype(np.float16).view(np.uint16)
        nan = np.isnan(x)
        np.testing.assert_array_equal(f16[~nan], ref16[~nan])
        assert np.all(np.isnan(f16[nan].view(np.float16)))
        bf = E.quantize(int(T.BF16), x)
        np.testing.assert_array_equal(bf, gguf.quants.quantize(x.reshape(1, -1), T.BF16).reshape(-1))
        f32 = E.quantize(int(T.F32), x)
        np.testing.assert_array_equal(f32, x.view(np.uint8))


def test_fp16_all_patterns_round_trip():
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    ours = E.dequantize(int(T.F16), h.view(np.uint8), h.size)
    with np.errstate(invalid="ignore"):   # ARM64: a signaling NaN's conversion raises FE_INVALID
        want = h.view(np.float16).astype(np.float32).view(np.uint32)
    # ember keeps a signaling NaN signaling, as numpy's cast does on x86; ARM64's FCVT (numpy's cast
    # there) sets the quiet bit
    snan = ((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0) & ((h & 0x0200) == 0)
    want[snan] &= ~np.uint32(0x00400000)
    np.testing.assert_array_equal(ours.view(np.uint32), want)
    back = E.quantize(int(T.F16), ours).view(np.uint16)
    finite = ~np.isnan(ours)
    np.testing.assert_array_equal(back[finite], h[finite])


def test_q8_activation_quantizers(level):
    rng = rng_for("quantize", "Q8_1/Q8_K")
    for name, x in float_rows(rng, 1024).items():
        # Q8_1 = Q8_0's d and quants plus s = f16(d * sum(q))
        q81 = E.quantize(int(T.Q8_1), x).reshape(-1, 36)
        q80 = gguf.quants.quantize(x.reshape(1, -1), T.Q8_0).reshape(-1, 34)
        np.testing.assert_array_equal(q81[:, 0:2], q80[:, 0:2], err_msg=name)
        np.testing.assert_array_equal(q81[:, 4:], q80[:, 2:], err_msg=name)
        # s uses the unrounded fp32 d = amax / 127, as ggml's quantize_row_q8_1 does
        d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
        qsum = q81[:, 4:].view(np.int8).astype(np.int64).sum(axis=1)
        s_ref = (qsum.astype(np.float32) * d).astype(np.float16)
        np.testing.assert_array_equal(q81[:, 2:4].copy().view(np.float16)[:, 0], s_ref, err_msg=name)
        # Q8_K: error within half a step, bsums are the sums of 16 quants
        q8k = E.quantize(int(T.Q8_K), x).reshape(-1, 292)
        dk = q8k[:, 0:4].copy().view(np.float32)[:, 0]
        qk = q8k[:, 4:260].view(np.int8).astype(np.int64)
        bsums = q8k[:, 260:292].copy().view(np.int16).astype(np.int64)
        np.testing.assert_array_equal(bsums, qk.reshape(-1, 16, 16).sum(axis=2), err_msg=name)
        back = E.dequantize(int(T.Q8_K), q8k.reshape(-1), x.size).reshape(-1, 256)
        err = np.abs(back - x.reshape(-1, 256))
        # d = -max/127 maps the largest-magnitude value to -127 and one of the opposite sign to
        # +127. The scale 1/d, its product with x and d * q each round once in fp32, so a value
        # whose scaled form lies within an ulp of a .5 tie may round away from x: up to a few ulps
        # of 128 steps past half a step.
        step = np.broadcast_to(np.abs(dk)[:, None], err.shape)
        half = step * (0.5 + 4 * 128 * 2.0**-24) + 1e-30
        clamped = qk == 127
        assert np.all(err[~clamped] <= half[~clamped]), name
        assert np.all(err <= 2 * half), name


def rmse(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)))


# Bounds a little above what this search (llama.cpp's reference algorithm) gives on N(0, 1):
# about 0.0716 (Q4_K), 0.0361 (Q5_K), 0.0178 (Q6_K) RMSE per unit std.
K_RMSE_BOUND = {T.Q4_K: 0.0745, T.Q5_K: 0.0375, T.Q6_K: 0.0185}


@pytest.mark.parametrize("t", K_QUANTIZED, ids=lambda t: t.name)
def test_kquant_round_trip(t):
    rng = rng_for("kquant", t.name)
    x = rng.standard_normal(256 * 512).astype(np.float32)
    q = E.quantize(int(t), x)
    assert q.size == x.size // 256 * GGML_QUANT_SIZES[t][1]
    back = E.dequantize(int(t), q, x.size)
    np.testing.assert_array_equal(back, gguf.quants.dequantize(q.reshape(1, -1), t).reshape(-1))
    err = rmse(back, x)
    print(f"{t.name} rmse/std on N(0,1): {err:.5f}")
    assert err < K_RMSE_BOUND[t]
    # the search must beat the legacy min/max formats of similar or higher bit width
    legacy = {T.Q4_K: T.Q4_1, T.Q5_K: T.Q5_0, T.Q6_K: T.Q5_1}[t]
    legacy_err = rmse(gguf.quants.dequantize(gguf.quants.quantize(x.reshape(1, -1), legacy), legacy).reshape(-1), x)
    assert err < legacy_err
    for name, xs in float_rows(rng, 2048).items():
        back = E.dequantize(int(t), E.quantize(int(t), xs), xs.size)
        assert np.all(np.isfinite(back)), name
        if name == "tiny":
            continue   # ~1e-6 values: the fp16 super-block scales underflow (as in ggml)
        scale = float(np.sqrt(np.mean(xs.astype(np.float64) ** 2))) or 1.0
        assert rmse(back, xs) < 4 * K_RMSE_BOUND[t] * scale, name
        if name == "zeros":
            assert np.all(back[256:512] == 0.0)


def sizes_for(t):
    elems = block_size(t)[0]
    if elems == 1:
        return [1, 7, 16, 33, 100, 577, 4096]
    if elems == 32:
        return [32, 64, 96, 160, 224, 576, 1536, 4096]
    return [256, 512, 768, 1280, 4096]


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_vec_dot_best_matches_ref(t, level):
    """Both kernels sum exact integer products per block and differ only in the order in which
    the fp32 per-block terms are added (and FMA rounding), so |best - ref| is bounded by
    (number of terms) * eps32 * sum(|terms|); the tolerance uses that bound."""
    rng = rng_for("vec_dot", t.name)
    elems, nbytes = block_size(t)
    vdt = T(E.vec_dot_type(int(t)))
    for n in sizes_for(t):
        for trial in range(3):
            x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
            if trial == 2 and _ember.type_info(int(t))["can_quantize"] and t not in (T.Q8_1, T.Q8_K):
                w = E.quantize(int(t), rng.standard_normal(n).astype(np.float32))
            else:
                w = random_blocks(t, n // elems, rng)
            best = E.vec_dot(int(t), w, x)
            ref = E.vec_dot(int(t), w, x, impl="ref")
            wd = E.dequantize(int(t), w, n).astype(np.float64)
            xd = E.dequantize(int(vdt), E.quantize(int(vdt), x), n).astype(np.float64)
            l1 = float(np.abs(wd * xd).sum())
            terms = n if elems == 1 else n // 32
            tol = (terms + 16) * 1.2e-7 * l1 + 1e-30
            assert abs(best - ref) <= tol, (t.name, n, best, ref, tol)
            # and the reference is the dot of the dequantized operands; the *_1 formats carry
            # their min term m * sum(x) through Q8_1's fp16 s = d * sum(q), accurate to 2^-11
            # of |m| * sum|x| per block (which l1 does not bound: d * q + m can be near 0)
            exact = float(wd @ xd)
            ref_tol = 1e-5 * l1 + 1e-30
            if t in (T.Q4_1, T.Q5_1):
                m = np.asarray(w, np.uint8).reshape(-1, nbytes)[:, 2:4].copy().view(np.float16)[:, 0]
                ref_tol += 2.0 ** -10 * float(np.abs(m.astype(np.float64)) @ np.abs(xd).reshape(-1, 32).sum(axis=1))
            elif vdt == T.Q8_1:
                ref_tol += 1e-3 * l1
            assert abs(ref - exact) <= ref_tol, (t.name, n, ref, exact)


@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1], ids=lambda t: t.name)
def test_activation_quantizer_matches_ref(t, level):
    """The matmul's activation quantizer (SIMD where there is one) writes the scalar reference's
    bytes: random magnitudes, zero blocks, exact halfway quotients of both signs, non-finite blocks."""
    rng = rng_for("activation quantizer", t.name)
    rows = [(rng.standard_normal(4096) * 10.0 ** rng.uniform(-30, 30)).astype(np.float32) for _ in range(8)]
    ties = np.zeros(64, dtype=np.float32)
    ties[:32] = np.arange(-15.5, 16.5, 1.0)   # with 127 in the block d = 1, so x / d = x:
    ties[31] = 127.0                          # every other value is an exact .5 tie
    ties[32:] = np.arange(-16, 16) + 0.5
    ties[63] = 127.0
    odd = np.zeros(96, dtype=np.float32)
    odd[5] = np.float32(1e-45)                        # a subnormal amax: d rounds to 0
    odd[40], odd[41], odd[70] = np.inf, 1.0, np.nan   # non-finite blocks take the scalar path
    odd = np.concatenate([odd, np.full(32, np.nan, dtype=np.float32)])
    for x in rows + [ties, odd, np.zeros(32, dtype=np.float32)]:
        best, ref = E.quantize(int(t), x, impl="best"), E.quantize(int(t), x, impl="ref")
        np.testing.assert_array_equal(best, ref)


def test_q8_k_activation_quantizer_matches_ref(level):
    """As above for Q8_K (super-blocks of 256): the first value of largest magnitude sets the
    scale (-127 / it), quotients round to nearest even, capped at 127."""
    rng = rng_for("activation quantizer", "Q8_K")
    rows = [(rng.standard_normal(4096) * 10.0 ** rng.uniform(-30, 30)).astype(np.float32) for _ in range(8)]
    special = np.zeros((6, 256), dtype=np.float32)
    special[0, 0] = -127.0                                 # iscale 1: every other value an exact tie
    special[0, 1:] = (np.arange(255) % 64 - 32) + 0.5
    special[1, 7], special[1, 200] = 3.0, -3.0             # equal magnitudes: the first one wins
    special[1, 8:200] = rng.uniform(-3, 3, 192)
    special[2, 3] = np.float32(1e-45)                      # subnormal max: the scale overflows
    special[3, 9], special[3, 10] = np.inf, 1.0            # non-finite blocks take the scalar path
    special[4, 100] = np.nan
    special[5, 50], special[5, 51] = -5.0, 5.0             # -127 and +127
    for x in rows + [special.reshape(-1), np.zeros(256, dtype=np.float32)]:
        best, ref = E.quantize(int(T.Q8_K), x, impl="best"), E.quantize(int(T.Q8_K), x, impl="ref")
        np.testing.assert_array_equal(best, ref)


NEW_TYPES = [T.MXFP4, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S] + LOW_BIT


def test_gguf_reader_takes_the_new_types(tmp_path):
    """A file (written by the gguf package) with a 2-D and a 3-D tensor of each new type: ember's reader
    knows every type id, sizes each tensor as gguf does and hands back its bytes, which dequantize as
    gguf's."""
    rng = rng_for("gguf new types")
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    data = {}
    for t in NEW_TYPES:
        elems, nbytes = block_size(t)
        for name, shape in ((f"{t.name}.2d", (3, 2 * elems)), (f"{t.name}.3d", (2, 3, elems))):
            n_blocks = int(np.prod(shape)) // elems
            raw = random_blocks(t, n_blocks, rng).reshape(*shape[:-1], shape[-1] // elems * nbytes)
            w.add_tensor(name, raw, raw_dtype=t)
            data[name] = (t, shape, raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = _ember.GGUFFile(str(path))
    got = {x["name"]: x for x in f.tensors()}
    for name, (t, shape, raw) in data.items():
        assert got[name]["type"] == int(t) and got[name]["ne"] == list(reversed(shape)), name
        assert got[name]["nbytes"] == raw.size, name
        mine = f.tensor_data(name)
        np.testing.assert_array_equal(mine, raw.reshape(-1), err_msg=name)
        ours = E.dequantize(int(t), np.ascontiguousarray(mine), int(np.prod(shape)))
        ref = gguf.quants.dequantize(raw.reshape(-1, raw.shape[-1]), t).reshape(-1)
        np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32), err_msg=name)


def test_bad_input_raises_value_error():
    x = np.ones(64, dtype=np.float32)
    with pytest.raises(ValueError, match="type id 99"):
        _ember.type_info(99)
    with pytest.raises(ValueError, match="type id"):
        E.quantize(4, x)   # 4 (old Q4_2) is not a type
    with pytest.raises(ValueError, match="Q4_0"):
        E.quantize(int(T.Q4_0), np.ones(33, dtype=np.float32))
    with pytest.raises(ValueError, match="no quantizer"):
        E.quantize(int(T.IQ2_S), np.ones(256, dtype=np.float32))
    with pytest.raises(ValueError, match="no quantizer"):
        E.quantize(int(T.IQ3_S), np.ones(256, dtype=np.float32))
    with pytest.raises(ValueError, match="MXFP4"):
        E.quantize(int(T.MXFP4), np.ones(48, dtype=np.float32))
    with pytest.raises(ValueError, match="bytes"):
        E.dequantize(int(T.MXFP4), np.zeros(18, dtype=np.uint8), 32)
    with pytest.raises(ValueError, match="bytes"):
        E.dequantize(int(T.Q4_1), np.zeros(39, dtype=np.uint8), 64)
    with pytest.raises(ValueError, match="Q6_K"):
        E.dequantize(int(T.Q6_K), np.zeros(210, dtype=np.uint8), 255)
    with pytest.raises(ValueError, match="bytes"):
        E.vec_dot(int(T.Q8_0), np.zeros(34, dtype=np.uint8), x)
    with pytest.raises(ValueError, match="impl"):
        E.vec_dot(int(T.Q8_0), np.zeros(68, dtype=np.uint8), x, impl="fast")


def test_real_model_tensors(smollm2_path):
    """SmolLM2's Q4_1 layer weights and Q8_0 token embedding (written by llama.cpp's quantizer):
    dequantize bit-exact vs gguf, and vec_dot of real rows against the dequantized dot."""
    rng = rng_for("real model")
    reader = gguf.GGUFReader(smollm2_path)
    tensors = {t.name: t for t in reader.tensors}
    for name, rows in (("blk.0.ffn_down.weight", slice(0, 576)), ("token_embd.weight", slice(1000, 1400))):
        t = tensors[name]
        qtype = T(int(t.tensor_type))
        data = np.ascontiguousarray(t.data[rows])
        n = int(t.shape[0])
        ours = E.dequantize(int(qtype), data.reshape(-1), data.shape[0] * n).reshape(data.shape[0], n)
        ref = gguf.quants.dequantize(data, qtype)
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))
        vdt = T(E.vec_dot_type(int(qtype)))
        x = rng.standard_normal(n).astype(np.float32)
        xd = E.dequantize(int(vdt), E.quantize(int(vdt), x), n).astype(np.float64)
        for r in rng.choice(data.shape[0], 16, replace=False):
            got = E.vec_dot(int(qtype), data[r], x)
            exact = float(ours[r].astype(np.float64) @ xd)
            l1 = float(np.abs(ours[r] * xd).sum())
            assert abs(got - exact) <= (1e-3 if vdt == T.Q8_1 else 1e-5) * l1, (name, r, got, exact)


@pytest.mark.parametrize("t", [T.IQ4_NL, T.Q2_K, T.Q3_K, T.IQ4_XS], ids=lambda t: t.name)
def test_quantize_matches_ggml(t):
    """ember's IQ4_NL (the iq4_nl KV cache's), Q2_K, Q3_K and IQ4_XS quantizers write the blocks of ggml's reference
    quantizers on the rows tools/gen_ggml_quant_reference.py gave them (normal, heavy-tailed, tiny, huge,
    positive, ties between IQ4_NL's levels, zero blocks). An IQ4_NL block of zeros is d = 0 (ggml leaves its
    quants unset, so only d is compared)."""
    ref = np.load(ROOT / "tests" / "reference" / "quant" / f"{t.name.lower()}_ggml.npz")
    nbytes = block_size(t)[1]
    for x, q in zip(ref["x"], ref["q"]):
        ours, want = E.quantize(int(t), x).reshape(-1, nbytes), q.reshape(-1, nbytes)
        zero = want[:, :2].copy().view(np.uint16)[:, 0] == 0 if t == T.IQ4_NL else np.zeros(len(want), bool)
        np.testing.assert_array_equal(ours[~zero], want[~zero])
        np.testing.assert_array_equal(ours[zero, :2], want[zero, :2])
