"""CPU fast quantized matmul (src/cpu/gemm_fast*.cpp): weight rows in the vector lanes instead of
vec_dot's float order. Its results must match float64 sums over the dequantized weights and the
activations quantized as vec_dot takes them to float rounding, and each token's result must be the
same whatever else shares its batch. Types with a single-token fast kernel
(conftest.SINGLE_TOKEN_FAST) take the fast arithmetic for every batch, one token, one sequence and
batch-invariant steps included (the engine's default mode is then batch-invariant too); the other
fast types take it for batches of several sequences only (n_seq > 1, not batch-invariant), where
one sequence, a batch-invariant batch and one token keep vec_dot's results. Every test runs at this
machine's level (the AVX-512 kernels where it has them) and again at the avx2 level (EMBER_SIMD,
set in-process)."""
import gguf
import numpy as np
import pytest

from conftest import SINGLE_TOKEN_FAST, each_simd_level, kernel_module, switches_overridden

K = kernel_module()

TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# The types with fast kernels at each SIMD level (the others keep the exact path).
FAST = {"avx512": set(TYPES), "avx2": {"Q4_0", "Q4_1", "Q8_0"}}
N_TOK = [1, 2, 3, 8, 16, 33, 64]


level = each_simd_level("avx2")


@pytest.fixture(scope="module")
def cpu(level):
    return K.Backend("cpu", 2)


def has_fast_kernel(name):
    return name in FAST.get(K.simd_level(), set())


def always_fast(name):
    return name in SINGLE_TOKEN_FAST.get(K.simd_level(), set())


def vec_dots(qtype, wq, x):
    return np.array([[K.vec_dot(qtype, wq[o], x[t], impl="best") for o in range(len(wq))] for t in range(len(x))],
                    np.float32)


def block_elems(name):
    return 256 if name.endswith("_K") else 32


def quantized_weight(rng, name, n_out, n_in):
    qtype = gguf.GGMLQuantizationType[name]
    wq = K.quantize(int(qtype), rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
    wd = gguf.quants.dequantize(wq.reshape(-1), qtype).reshape(n_out, n_in).astype(np.float64)
    return int(qtype), wq, wd


def activations(rng, n_tok, n_in):
    """Per-token scales spread over decades, as hidden states are."""
    return (rng.standard_normal((n_tok, n_in)) * 10.0 ** rng.uniform(-2, 2, (n_tok, 1))).astype(np.float32)


def reference(name, wq, wd, x):
    """float64 sums of the dequantized weights times the activations quantized as vec_dot takes
    them (Q8_0; Q8_1 for Q4_1, whose min term takes Q8_1's fp16 s = d * sum(q); Q8_K for the
    K-quants), and the scale of their rounding: sum |w x|."""
    n_tok, n_in = x.shape
    act = {"Q4_1": "Q8_1"}.get(name, "Q8_K" if name.endswith("_K") else "Q8_0")
    xq = K.quantize(int(gguf.GGMLQuantizationType[act]), x.ravel())
    if act == "Q8_K":   # float32 d, int8 q[256], int16 bsums[16]
        b = xq.reshape(n_tok, -1, 292)
        d = b[:, :, :4].copy().view(np.float32).astype(np.float64)
        xd = (d * b[:, :, 4:260].view(np.int8)).reshape(n_tok, n_in)
        return xd @ wd.T, np.abs(xd) @ np.abs(wd).T
    head = 4 if act == "Q8_1" else 2   # fp16 d (, fp16 s), int8 q[32]
    b = xq.reshape(n_tok, -1, 32 + head)
    d = b[:, :, :2].copy().view(np.float16).astype(np.float64)
    q = b[:, :, head:].view(np.int8).astype(np.float64)
    xd = (d * q).reshape(n_tok, n_in)
    want, bound = xd @ wd.T, np.abs(xd) @ np.abs(wd).T
    if act == "Q8_1":   # m_w * (s - d * sum(q)) per block, m the fp16 min of Q4_1 blocks (d, m, qs[16])
        s_fp16 = b[:, :, 2:4].copy().view(np.float16).astype(np.float64)[:, :, 0]
        m = wq.reshape(wq.shape[0], -1, 20)[:, :, 2:4].copy().view(np.float16).astype(np.float64)[:, :, 0]
        want = want + (s_fp16 - d[:, :, 0] * q.sum(2)) @ m.T
        bound = bound + np.abs(s_fp16) @ np.abs(m).T
    return want, bound


def assert_float_rounding(got, want, bound, what):
    """|got - want| within float32 rounding of the sums: a few ulps of sum |w x| per block."""
    err = np.abs(got - want)
    tol = 1e-5 * bound
    assert (err <= tol).all(), f"{what}: worst error {(err / np.maximum(bound, 1e-30)).max():.3g} of sum |w x|"


# n_out: a partial row tile (37 = 2 x 16 + 5 for AVX-512, 4 x 8 + 5 for AVX2), whole tiles over
# several thread chunks (96), and a single short tile (5).
# (the K-quants take row lengths of whole super-blocks of 256)
SHAPES = [(576, 37), (1536, 96), (32, 5), (96, 37), (256, 37), (768, 21)]


@pytest.mark.parametrize("name,n_in,n_out", [(t, n_in, n_out) for t in TYPES for n_in, n_out in SHAPES
                                             if n_in % block_elems(t) == 0])
def test_fast_matmul_matches_float64(cpu, rng, name, n_in, n_out):
    if not has_fast_kernel(name):
        pytest.skip(f"no fast {name} kernel at SIMD level {K.simd_level()}")
    qtype, wq, wd = quantized_weight(rng, name, n_out, n_in)
    for n_tok in N_TOK:
        x = activations(rng, n_tok, n_in)
        got = cpu.matmul(qtype, wq, n_in, x, n_seq=2)
        assert got.shape == (n_tok, n_out)
        assert_float_rounding(got, *reference(name, wq, wd, x), f"{name} n_in={n_in} n_tok={n_tok}")


@pytest.mark.parametrize("name", TYPES)
def test_fast_matmul_is_close_to_vec_dot_but_not_it(cpu, rng, name):
    """The fast path is really taken for several sequences (and for one token where the type has
    a single-token kernel): its sums differ from vec_dot's in the last bits, and only there (both
    quantize the activations alike)."""
    n_in, n_out = 768, 53
    qtype, wq, wd = quantized_weight(rng, name, n_out, n_in)
    for n_tok in N_TOK[:5]:
        x = activations(rng, n_tok, n_in)
        fast = cpu.matmul(qtype, wq, n_in, x, n_seq=3)
        dots = vec_dots(qtype, wq, x)
        assert_float_rounding(fast, dots, reference(name, wq, wd, x)[1], f"{name} n_tok={n_tok}")
        if has_fast_kernel(name) and (n_tok > 1 or always_fast(name)):
            assert (fast != dots).any(), f"{name} n_tok={n_tok}: the fast path was not taken"
        else:
            np.testing.assert_array_equal(fast.view(np.uint32), dots.view(np.uint32), err_msg=f"{name} n_tok={n_tok}")


@pytest.mark.parametrize("name", TYPES)
def test_batch_shape_never_changes_a_result_or_stays_exact(cpu, rng, name):
    """One sequence, several, or a batch-invariant step: the same bits for a type with a
    single-token kernel; for the others, one sequence or a batch-invariant batch keeps the exact
    (vec_dot) results, also after a multi-sequence batch."""
    n_in, n_out = 768, 37
    qtype, wq, _ = quantized_weight(rng, name, n_out, n_in)
    for n_tok in [1, 2, 8, 33]:
        x = activations(rng, n_tok, n_in)
        want = cpu.matmul(qtype, wq, n_in, x, n_seq=3) if always_fast(name) else vec_dots(qtype, wq, x)
        for kw in [dict(n_seq=1), dict(n_seq=4, batch_invariant=True), dict(n_seq=1)]:
            got = cpu.matmul(qtype, wq, n_in, x, **kw)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{name} {kw}")
            cpu.matmul(qtype, wq, n_in, x, n_seq=2)


# Row counts over partial and whole groups of 16, row lengths of 1, 2, 3, 17, 18 (SmolLM2), 24
# and 48 blocks: whole chunks of 16 blocks, leftover pairs and an odd last block; 129 and 344
# (llama2-7b's down projection) blocks: long rows, whose block heads the float steps read back
# after the whole row's integer pass.
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n_in,n_out", [(32, 5), (64, 16), (96, 37), (544, 40), (576, 1536), (768, 21), (1536, 96),
                                        (4128, 19), (11008, 33)])
def test_single_token_kernel_is_the_batched_kernel(cpu, rng, name, n_in, n_out):
    """FastGemm::gemv (a row read as one run, block sums transposed into the lanes) gives each
    token exactly what the batched kernel gives it in a batch of 9."""
    if not always_fast(name):
        pytest.skip(f"no single-token fast {name} kernel at SIMD level {K.simd_level()}")
    qtype, wq, _ = quantized_weight(rng, name, n_out, n_in)
    x = activations(rng, 9, n_in)
    full = cpu.matmul(qtype, wq, n_in, x, n_seq=2)
    for t in range(len(x)):
        one = cpu.matmul(qtype, wq, n_in, x[t:t + 1])
        np.testing.assert_array_equal(one.view(np.uint32), full[t:t + 1].view(np.uint32), err_msg=f"token {t}")


def test_fast_results_do_not_depend_on_the_batch(cpu, rng):
    """Each token's fast result is the same whatever tokens share its batch (tile position, tail
    tile size, alone where the type has a single-token kernel): the kernels do the same
    operations for every token."""
    n_in, n_out = 768, 37
    for name in TYPES:
        qtype, wq, _ = quantized_weight(rng, name, n_out, n_in)
        x = activations(rng, 33, n_in)
        full = cpu.matmul(qtype, wq, n_in, x, n_seq=2)
        for lo, hi in [(0, 2), (5, 13), (30, 33), (1, 33)] + ([(0, 1), (17, 18)] if always_fast(name) else []):
            part = cpu.matmul(qtype, wq, n_in, x[lo:hi], n_seq=2)
            np.testing.assert_array_equal(part.view(np.uint32), full[lo:hi].view(np.uint32),
                                          err_msg=f"{name} {lo}:{hi}")


def test_matmul_many_hands_out_all_weights(cpu, rng):
    """matmul_many (Q, K, V; gate, up) over weights of one type: the same results as one fast
    matmul per weight; weights of mixed types go their own ways and still match."""
    n_in = 768
    for names in [["Q4_1", "Q4_1", "Q4_1"], ["Q8_0", "Q8_0"], ["Q4_K", "Q4_K", "Q6_K"], ["Q4_0", "Q4_1", "Q8_0"]]:
        ws = [quantized_weight(rng, nm, n_out, n_in) for nm, n_out in zip(names, [37, 16, 80])]
        for n_tok in [1, 2, 8, 17]:
            x = activations(rng, n_tok, n_in)
            outs = cpu.matmul_many([w[0] for w in ws], [w[1] for w in ws], n_in, x, n_seq=2)
            for nm, (qtype, wq, wd), got in zip(names, ws, outs):
                one = cpu.matmul(qtype, wq, n_in, x, n_seq=2)
                np.testing.assert_array_equal(got.view(np.uint32), one.view(np.uint32),
                                              err_msg=f"{names} n_tok={n_tok}")
                assert_float_rounding(got, *reference(nm, wq, wd, x), f"{names} n_tok={n_tok}")
            invariant = cpu.matmul_many([w[0] for w in ws], [w[1] for w in ws], n_in, x, n_seq=2, batch_invariant=True)
            for nm, (qtype, wq, _), got, fast in zip(names, ws, invariant, outs):
                want = fast if always_fast(nm) else vec_dots(qtype, wq, x)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{nm} n_tok={n_tok}")


def test_fast_kernels_switched_off(rng):
    """A backend made with EMBER_CPU_FAST_GEMM=0 keeps vec_dot's bits for every batch: several
    sequences, and one token of a type with a single-token fast kernel, included."""
    with switches_overridden(EMBER_CPU_FAST_GEMM="0"):
        exact = K.Backend("cpu", 2)
    n_in = 768
    for name in TYPES:
        qtype, wq, _ = quantized_weight(rng, name, 37, n_in)
        for n_tok, n_seq in [(1, 1), (8, 2), (33, 3)]:
            x = activations(rng, n_tok, n_in)
            want = vec_dots(qtype, wq, x)
            got = exact.matmul(qtype, wq, n_in, x, n_seq=n_seq)
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{name} n_tok={n_tok}")
            many = exact.matmul_many([qtype, qtype], [wq, wq], n_in, x, n_seq=n_seq)
            for y in many:
                np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32), err_msg=f"{name} many")
