"""The CPU attention's SIMD levels (src/cpu/attention_math*) against its scalar reference: the same
bits, since each keeps the scalar loop's order of products and sums. Each level is a backend made
under its EMBER_SIMD value, in this process, on the same random inputs."""
import numpy as np
import pytest

from conftest import at_simd_level, kernel_module, rng_for, simd_levels

# n_head, n_head_kv, head_dim, cache length, kv type, kv block size, q scale, and optionally a
# sliding window and the query positions. Head dims: 64 and 128 (whole passes of 64 outputs), 80 (a
# pass plus a 16-wide tail), 32 (tail only), 40 (not a multiple of 16: the scalar path at every
# level). q scale 1e-6 puts the f16-rounded q among f16 subnormals; 6 spreads the scores so that
# probabilities underflow f16. The windowed / single-position cases move the first gathered
# position off the 16-position grid, so that f16 key groups mix the whole-group gather (16 slots of
# one block) with the row-at-a-time one (groups across blocks, a partial last group). GQA groups of
# 1, 2, 3 and 6 query heads: the f16 values' weighted sum takes up to 4 heads a pass. The last
# cases scale K and V: 1e-5 stores f16 subnormals, 3e4 values past f16's range (inf), so that the
# SIMD store's rounding meets the scalar float_to_half's at its edges. Every other case adds
# per-head sink logits (gpt-oss), which join the softmax's max and sum.
CASES = [
    (6, 2, 64, 75, "f16", 16, 1.0),
    (4, 4, 128, 130, "f16", 5, 1.0),
    (3, 1, 80, 40, "f16", 16, 1.0),
    (6, 2, 64, 75, "f16", 16, 1e-6),
    (6, 2, 64, 75, "f16", 16, 6.0),
    (2, 1, 40, 21, "f16", 4, 1.0),
    (4, 4, 32, 33, "f32", 8, 1.0),
    (6, 2, 64, 75, "q8_0", 16, 1.0),
    (6, 2, 64, 75, "f16", 16, 1.0, 37, [74]),
    (6, 2, 64, 100, "f16", 32, 1.0, 50, [99]),
    (6, 2, 64, 75, "f16", 32, 1.0, 0, [74]),
    (3, 1, 80, 91, "f16", 32, 1.0, 0, [40, 90]),
    (6, 2, 64, 75, "f16", 8, 1.0, 0, [74]),
    (4, 2, 128, 130, "f16", 16, 1.0, 0, [129]),
    (6, 2, 64, 91, "f16", 64, 1.0, 20, [70, 90]),
    (6, 2, 64, 67, "f16", 48, 1.0, 33, [66]),
    (12, 2, 64, 75, "f16", 16, 1.0),
    (6, 2, 64, 75, "f16", 16, 1.0, 0, [0, 37, 74], 1e-5, 1e-5),
    (6, 2, 64, 75, "f16", 16, 1.0, 0, [0, 37, 74], 1.0, 3e4),
    (3, 1, 80, 40, "f16", 16, 1.0, 0, [39], 1e-5, 3e4),
]

def run_at(level, seed):
    rng = np.random.default_rng(seed)
    with at_simd_level(level):
        cpu = kernel_module().Backend("cpu", 2)
    res = {}
    for i, (nh, nkv, hd, length, kv, bs, qs, *rest) in enumerate(CASES):
        window, pos, ks, vs = ((rest + [1.0, 1.0])[:4] if rest
                               else (0, sorted({0, 1, length // 2, length - 2, length - 1}), 1.0, 1.0))
        k = (rng.standard_normal((length, nkv * hd)) * ks).astype(np.float32)
        v = (rng.standard_normal((length, nkv * hd)) * vs).astype(np.float32)
        q = (rng.standard_normal((len(pos), nh * hd)) * qs).astype(np.float32)
        sinks = (np.log(length) + rng.uniform(-3, 3, nh)).astype(np.float32) if i % 2 else None
        res[i] = cpu.attention(q, k, v, pos, nh, nkv, hd, bs, int(rng.integers(1 << 30)), kv_type=kv, window=window,
                               sinks=sinks)
    return res


def test_simd_levels_match_scalar_bit_for_bit():
    # x86: the best level (AVX-512 where there is one) and AVX2; ARM64: the best level, NEON
    levels = [level for level in simd_levels("avx2") if level != "scalar"]
    if not levels:
        pytest.skip("this CPU has neither AVX2 nor NEON: only the scalar attention can run here")
    seed = int(rng_for("attention simd").integers(1 << 31))
    scalar = run_at("scalar", seed)
    for level in levels:
        got = run_at(level, seed)
        for i, case in enumerate(CASES):
            np.testing.assert_array_equal(got[i].view(np.uint32), scalar[i].view(np.uint32),
                                          err_msg=f"{level} vs scalar, case {case}")
