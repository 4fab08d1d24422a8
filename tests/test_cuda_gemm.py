"""The CUDA backend's GEMMs of batched decode steps, through Backend.matmul, matmul_many and the
fused feed-forward op, on fresh random data. Skipped with the reason when ember has no CUDA
backend or no GPU.
- gemm_dq (cuda/gemm_dq.cu: f16 tensor cores on weights dequantized in registers): Q4_0, Q4_1 and
  Q8_0 rows whose width is a multiple of 256, 9..256 tokens (rows up to 2048 wide from 65 tokens
  on): against the float64 product of f16-rounded weights and activations (what the kernel
  multiplies), the exact product, the CPU backend (q8 activations) and itself run to run.
  On Hopper it multiplies with wgmma in 256- or 192-row tiles; the gemm_dq tests run on a backend
  of each form (dq_gpu): as the kernel choice picks it, the mma.sync one (EMBER_CUDA_GEMM_DQ_WGMMA=0)
  and each row tile (EMBER_CUDA_GEMM_DQ_ROWS), the switches set in-process for that backend.
- gemm_q8 (cuda/gemm_q8.cu: int8 tensor cores on q8_1 activations): the other 32-element block
  formats and widths, 9..64 tokens, rows wider than 2048 (narrower rows keep the CPU-order GEMV):
  against the float64 product, the CPU backend (the same per-block integer dots and products,
  summed in another order) and itself run to run (K splits summed in a fixed order);
  test_gemm_q8_without_dq runs it on gemm_dq's formats too, on a backend made with EMBER_CUDA_GEMM_DQ=0.
- gemm_dq on Q4_K and Q6_K (EMBER_CUDA_GEMM_KQ=1, opt-in: the kernel choice gives it their batches
  of 9..64 tokens, which otherwise take the GEMV in chunks of 8): fresh random weights, 9..64
  tokens, rows not a multiple of the row tiles, runs of several weights in one launch, each of
  gemm_dq's forms: against the float64 product of what the kernel multiplies (the scales rounded
  to f16 as the kernel converts them, each weight rounded once to f16; f16 activations), the exact
  product, the chunked GEMV of a backend without the switch, and itself run to run.
- batch-invariant steps: the GEMV in chunks of 8 tokens at every batch size."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import backend_reference as ref_ops
from conftest import kernel_module, rng_for
from ember import switches
from ember.switches import overridden
from test_cuda import (cpu, cuda_backend, dequant, gpu, quantized_weight, random_weight, rel_err,   # noqa: F401
                       unfused_backend)

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
N_TOK = [9, 16, 33, 64]   # each token tile: 16, 32, 64 (a partial one at 9 and 33)
# (n_out, n_in): rows not a multiple of the 128-row tile; 65 blocks (a last partial stage of the
# 4-block pipeline, metadata rows not 16-byte aligned); 4096 and 11008 wide (K split over a
# cluster).
SHAPES = [(300, 2080), (1000, 4096), (129, 11008)]

# The `gpu` fixture's backend has gemm_dq off where this run's switches say so.
DQ_OFF = next(r["value"] for r in switches.table() if r["name"] == "EMBER_CUDA_GEMM_DQ") == "0"
DQ_TYPES = [T.Q4_0, T.Q4_1, T.Q8_0]
MAX_DQ_TOKENS = 256   # kMaxGemmDqTokens (cuda/kernels.h)
# Token tiles of 16, 32, 64 (partial at 9 and 33), several tiles of 64 (65: a last one of one token).
DQ_N_TOK = [9, 16, 33, 64, 65, 128, 200, 256]   # wgmma: tiles of 16, 32, 64, 128
# (n_out, n_in): rows not a multiple of the row tiles (256, wgmma 192), K split over a cluster (16 stages of
# 4096; 11008: 43 nibble stages, an uneven split); rows of 1792 (the CPU-order GEMV up to 64 tokens).
DQ_SHAPES = [(600, 4096), (129, 11008), (520, 1792)]


def dq_batch(t, n_in, n_tok):
    """Whether the kernel choice gives this batch to gemm_dq where it is on (takes_gemm_dq)."""
    return (t in DQ_TYPES and n_in % 256 == 0 and 8 < n_tok <= MAX_DQ_TOKENS
            and not (n_in <= 2048 and n_tok <= 64))


def takes_dq(t, n_in, n_tok):
    """Whether the `gpu` fixture's backend gives this batch to gemm_dq."""
    return not DQ_OFF and dq_batch(t, n_in, n_tok)


def same_bits(a, b):
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def f16_round(a):
    return a.astype(np.float16).astype(np.float64)


def gpu_matmul_case(gpu, key, t, n_tok, shape):
    """Fresh random weights of type t and shape (n_out, n_in), activations, and the GPU's product."""
    n_out, n_in = shape
    rng = rng_for(key, t.name, n_tok, n_out, n_in)
    w = random_weight(t, n_out, n_in, rng)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    y = gpu.matmul(int(t), w, n_in, x)
    assert y.shape == (n_tok, n_out)
    return w, x, y


def cases(types, n_toks, shapes, dq, taken=takes_dq):
    """(t, n_tok, shape) parameters whose batch gemm_dq takes (dq) or leaves to the other paths."""
    return [pytest.param(t, n, s, id=f"{s[0]}x{s[1]}-{n}-{t.name}")
            for t in types for n in n_toks for s in shapes if taken(t, s[1], n) == dq]


def check_gemm_q8(gpu, cpu, t, n_tok, shape):
    n_in = shape[1]
    w, x, y = gpu_matmul_case(gpu, "gemm_q8", t, n_tok, shape)
    ref = x.astype(np.float64) @ dequant(t, w, n_in).T
    assert rel_err(y, ref) < 1.5e-2   # int8 activations (q8_1), as test_cuda.py's test_matmul
    assert rel_err(y, cpu.matmul(int(t), w, n_in, x)) < 1e-4   # the same products, another order
    assert same_bits(y, gpu.matmul(int(t), w, n_in, x)), "not deterministic"


# Batches gemm_dq takes run in test_gemm_dq_matmul (and with gemm_dq off in test_gemm_q8_without_dq).
@pytest.mark.parametrize("t,n_tok,shape", cases(TYPES, N_TOK, SHAPES, dq=False))
def test_gemm_q8_matmul(gpu, cpu, t, n_tok, shape):
    check_gemm_q8(gpu, cpu, t, n_tok, shape)


@pytest.fixture(scope="module")
def gpu_without_dq():
    return cuda_backend(EMBER_CUDA_GEMM_DQ="0")


@pytest.mark.parametrize("t,n_tok,shape", cases(DQ_TYPES, N_TOK, SHAPES, dq=True, taken=dq_batch))
def test_gemm_q8_without_dq(gpu_without_dq, cpu, t, n_tok, shape):
    """gemm_q8 on the formats and widths gemm_dq takes, on a backend made with gemm_dq off."""
    check_gemm_q8(gpu_without_dq, cpu, t, n_tok, shape)


# gemm_dq's kernel forms, each a backend made with gemm_dq on and its switch: as the kernel choice
# picks it (wgmma on Hopper, each launch picking its row tile), the mma.sync form (GPUs before
# Hopper, builds without sm_90a) and the wgmma form's two row tiles (on other GPUs the row tile
# switch leaves the mma.sync form, so those repeat it).
DQ_FORMS = {
    "chosen": {},
    "mma_sync": {"EMBER_CUDA_GEMM_DQ_WGMMA": "0"},
    "wgmma_rows_256": {"EMBER_CUDA_GEMM_DQ_ROWS": "256"},
    "wgmma_rows_192": {"EMBER_CUDA_GEMM_DQ_ROWS": "192"},
}


@pytest.fixture(scope="module", params=list(DQ_FORMS))
def dq_gpu(request):
    return cuda_backend(EMBER_CUDA_GEMM_DQ="1", **DQ_FORMS[request.param])


def test_gemm_dq_bad_rows_switch(monkeypatch):
    """A row tile gemm_dq has no kernel for is refused naming the switch: as an override at once,
    from the environment when a backend is made."""
    with pytest.raises(ValueError, match=r"EMBER_CUDA_GEMM_DQ_ROWS must be 0, 192 or 256 \(got '128'\)"):
        with overridden(EMBER_CUDA_GEMM_DQ_ROWS="128"):
            pass
    monkeypatch.setenv("EMBER_CUDA_GEMM_DQ_ROWS", "128")
    with pytest.raises(ValueError, match=r"EMBER_CUDA_GEMM_DQ_ROWS must be .*'128' from the environment"):
        kernel_module().Backend("cuda")


@pytest.mark.parametrize("t,n_tok,shape", cases(DQ_TYPES, DQ_N_TOK, DQ_SHAPES, dq=True, taken=dq_batch))
def test_gemm_dq_matmul(dq_gpu, cpu, t, n_tok, shape):
    gpu = dq_gpu
    n_in = shape[1]
    w, x, y = gpu_matmul_case(gpu, "gemm_dq", t, n_tok, shape)
    wd = dequant(t, w, n_in)
    # The kernel's products: each weight d * q (+ m) and each activation rounded to f16 (a wrong
    # K order or fragment would be far off), summed in f32.
    assert rel_err(y, f16_round(x) @ f16_round(wd).T) < 1e-4
    assert rel_err(y, x.astype(np.float64) @ wd.T) < 2e-3   # f16 activations and weights
    assert rel_err(y, cpu.matmul(int(t), w, n_in, x)) < 1.5e-2   # the CPU rounds activations to int8
    assert same_bits(y, gpu.matmul(int(t), w, n_in, x)), "not deterministic"


@pytest.mark.parametrize("t", DQ_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", [2, 5, 8])
def test_gemm_dq_engine_decode_step(dq_gpu, cpu, t, n_tok):
    """An engine decode step of 2..8 sequences (one token each) takes gemm_dq; a single sequence's
    batch of the same size keeps the GEMV, and the two agree within the f16 rounding of x."""
    gpu = dq_gpu
    n_out, n_in = 600, 4096
    rng = rng_for("gemm_dq_decode", t.name, n_tok)
    w = random_weight(t, n_out, n_in, rng)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    y = gpu.matmul(int(t), w, n_in, x, n_seq=n_tok)
    wd = dequant(t, w, n_in)
    assert rel_err(y, f16_round(x) @ f16_round(wd).T) < 1e-4
    assert rel_err(y, gpu.matmul(int(t), w, n_in, x)) < 1.5e-2
    assert rel_err(y, cpu.matmul(int(t), w, n_in, x)) < 1.5e-2
    assert same_bits(y, gpu.matmul(int(t), w, n_in, x, n_seq=n_tok)), "not deterministic"


def test_gemm_dq_matmul_many(dq_gpu):
    """Weights of one input: x converted once for gemm_dq's weights, again after a weight that
    cuBLAS takes (its f16 copy of x shares the scratch); each output has its own matmul's bits."""
    gpu = dq_gpu
    rng = rng_for("gemm_dq_many")
    n_in, n_tok = 4096, 40
    types = [T.Q4_0, T.Q8_0, T.F16, T.Q4_0]
    ws = [random_weight(t, n_out, n_in, rng) for t, n_out in zip(types, (300, 256, 200, 520))]
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    ys = gpu.matmul_many([int(t) for t in types], ws, n_in, x)
    for t, w, y in zip(types, ws, ys):
        assert same_bits(y, gpu.matmul(int(t), w, n_in, x)), t.name


@pytest.mark.parametrize("n_tok,n_seq", [(40, None), (8, 8), (128, 128)])
def test_gemm_dq_runs_of_weights(dq_gpu, n_tok, n_seq):
    """Consecutive weights of one format go to gemm_dq as one launch (up to three, their row tiles
    one after another): each output is still its own product, whatever the run's split of K."""
    gpu = dq_gpu
    rng = rng_for("gemm_dq_runs", n_tok)
    n_in = 4096
    types = [T.Q4_0, T.Q4_0, T.Q4_0, T.Q4_0, T.Q8_0, T.Q8_0]
    ws = [random_weight(t, n_out, n_in, rng) for t, n_out in zip(types, (300, 520, 100, 256, 1000, 72))]
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    ys = gpu.matmul_many([int(t) for t in types], ws, n_in, x, n_seq=n_seq)
    for t, w, y in zip(types, ws, ys):
        assert rel_err(y, f16_round(x) @ f16_round(dequant(t, w, n_in)).T) < 1e-4, t.name
    again = gpu.matmul_many([int(t) for t in types], ws, n_in, x, n_seq=n_seq)
    assert all(same_bits(a, b) for a, b in zip(ys, again)), "not deterministic"


@pytest.mark.parametrize("t", [T.Q4_0, T.F16], ids=lambda t: t.name)
def test_batch_invariant_any_size(gpu, t):
    """Batch-invariant steps keep the GEMV (chunks of 8 tokens) at every size: a token's row has
    the same bits in a batch of 200, of 16 and of 8 (the decode GEMV)."""
    rng = rng_for("gemm_invariant", t.name)
    n_out, n_in = 300, 4096
    w = random_weight(t, n_out, n_in, rng)
    x = rng.standard_normal((200, n_in)).astype(np.float32)
    y200 = gpu.matmul(int(t), w, n_in, x, n_seq=200, batch_invariant=True)
    y16 = gpu.matmul(int(t), w, n_in, x[:16], n_seq=16, batch_invariant=True)
    assert same_bits(y200[:16], y16)
    assert same_bits(y200[:8], gpu.matmul(int(t), w, n_in, x[:8]))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_1], ids=lambda t: t.name)
def test_gemm_q8_ffn_same_bits(gpu, t):
    """The fused feed-forward op at 40 tokens (Q4_0: gemm_dq; Q5_1: gemm_q8, whose q8_1 blocks the
    norm and the gated activation write, no quantize launch): the same bits as the unfused kernels."""
    rng = rng_for("gemm_q8_ffn", t.name)
    n_in, n_ff, n_tok = 2560, 2304, 40
    gate, up = quantized_weight(t, n_ff, n_in, rng), quantized_weight(t, n_ff, n_in, rng)
    down = quantized_weight(t, n_in, n_ff, rng)
    x, res = rng.standard_normal((2, n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    args = (int(t), gate, up, down, n_in, x, norm, 1e-5, res, "silu")
    y, _ = gpu.ffn(*args)
    y_unfused, _ = unfused_backend().ffn(*args)
    assert np.array_equal(y.view(np.uint32), y_unfused.view(np.uint32))
    xn = ref_ops.rmsnorm(x.astype(np.float64) + res, norm, 1e-5)
    g, u = xn @ dequant(t, gate, n_in).T, xn @ dequant(t, up, n_in).T
    assert rel_err(y, ref_ops.gated_act(g, u, "silu") @ dequant(t, down, n_ff).T) < 5e-2   # two roundings of x


# ---- gemm_dq on Q4_K and Q6_K (EMBER_CUDA_GEMM_KQ=1) ----

KQ_TYPES = [T.Q4_K, T.Q6_K]

KQ_N_TOK = [9, 17, 33, 64]   # token tiles of 16, 32, 64 (partial at 9, 17, 33)
# (n_out, n_in): rows not a multiple of the row tiles (256, wgmma 192); 16 super-blocks (a K split
# over a cluster); 43 (an uneven split); rows of 1792 and 768 (the CPU-order width class: Q4_K's
# GEMV never kept the CPU's order, so gemm_dq takes them too).
KQ_SHAPES = [(600, 4096), (129, 11008), (520, 1792), (300, 768)]


def q4_k_as_gemm_dq(w, n_in):
    """float64 [n_out, n_in]: Q4_K weights as gemm_dq unpacks them. Each sub-block of 32 takes
    D = d * sc and M = dmin * m rounded to f16, each weight q * D - M rounded once to f16 (HFMA2).
    Block: f16 d, dmin; 12 bytes of 6-bit scales and mins; 128 quant bytes, chunk c of 32 holding
    sub-block 2c in its low nibbles and 2c + 1 in its high ones."""
    b = w.reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float64)
    s = b[:, 4:16].astype(np.int64)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    dd, mm = f16_round(d * sc), f16_round(dmin * mn)
    qs = b[:, 16:].astype(np.int64).reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32)
    return f16_round(q * dd[:, :, None] - mm[:, :, None]).reshape(w.shape[0], n_in)


def q6_k_as_gemm_dq(w, n_in):
    """float64 [n_out, n_in]: Q6_K weights as gemm_dq unpacks them. Each group of 16 takes
    D = d * sc rounded to f16, each weight (q - 32) * D rounded once to f16 (HMUL2). Block: ql[128],
    qh[64], int8 scales[16], f16 d; element 32j + l of half n is ql byte 64n + 32 (j & 1) + l, nibble
    j >> 1, with bits 2j, 2j + 1 of qh byte 32n + l on top, scale 8n + 2j + l // 16."""
    b = w.reshape(-1, 210)
    ql = b[:, :128].astype(np.int64).reshape(-1, 2, 2, 32)   # [block][n][j & 1][l]
    qh = b[:, 128:192].astype(np.int64).reshape(-1, 2, 32)   # [block][n][l]
    sc = b[:, 192:208].view(np.int8).astype(np.float64)
    d = b[:, 208:210].copy().view(np.float16).astype(np.float64)
    j = np.arange(4)
    nibble = (ql[:, :, j & 1, :] >> (4 * (j >> 1))[None, None, :, None]) & 15   # [block][n][j][l]
    high = (qh[:, :, None, :] >> (2 * j)[None, None, :, None]) & 3
    q = (nibble | (high << 4)) - 32
    dd = f16_round(d * sc).reshape(-1, 2, 4, 2)   # [block][n][j][l // 16]
    return f16_round(q.reshape(-1, 2, 4, 2, 16) * dd[..., None]).reshape(w.shape[0], n_in)


KQ_MODEL = {T.Q4_K: q4_k_as_gemm_dq, T.Q6_K: q6_k_as_gemm_dq}


@pytest.mark.parametrize("t", KQ_TYPES, ids=lambda t: t.name)
def test_kq_model_is_the_format(t):
    """The model the gemm_kq tests hold the kernel to reads the format as gguf does, up to its f16
    roundings (a wrong element order would be far off)."""
    rng = rng_for("gemm_kq_model", t.name)
    w = random_weight(t, 40, 768, rng)
    assert rel_err(KQ_MODEL[t](w, 768), dequant(t, w, 768)) < 1e-3


@pytest.fixture(scope="module", params=list(DQ_FORMS))
def kq_gpu(request):
    return cuda_backend(EMBER_CUDA_GEMM_DQ="1", EMBER_CUDA_GEMM_KQ="1", **DQ_FORMS[request.param])


@pytest.fixture(scope="module")
def gpu_without_kq():
    return cuda_backend(EMBER_CUDA_GEMM_KQ="0")


@pytest.mark.parametrize("shape", KQ_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("n_tok", KQ_N_TOK)
@pytest.mark.parametrize("t", KQ_TYPES, ids=lambda t: t.name)
def test_gemm_kq_matmul(kq_gpu, gpu_without_kq, t, n_tok, shape):
    n_out, n_in = shape
    w, x, y = gpu_matmul_case(kq_gpu, "gemm_kq", t, n_tok, shape)
    # What the kernel multiplies, summed in f32 (a wrong K order, fragment or sub-block scale would be far off).
    assert rel_err(y, f16_round(x) @ KQ_MODEL[t](w, n_in).T) < 1e-4
    assert rel_err(y, x.astype(np.float64) @ dequant(t, w, n_in).T) < 2e-3   # f16 activations, scales, weights
    # the chunked GEMV (q8_1 activations)
    assert rel_err(y, gpu_without_kq.matmul(int(t), w, n_in, x)) < 1.5e-2
    assert same_bits(y, kq_gpu.matmul(int(t), w, n_in, x)), "not deterministic"


@pytest.mark.parametrize("n_tok,n_seq", [(40, None), (32, 32), (9, None)])
def test_gemm_kq_runs_of_weights(kq_gpu, n_tok, n_seq):
    """Consecutive weights of one K-quant format go to gemm_dq as one launch (up to three, their row
    tiles one after another), among weights other kernels take (Q4_0: gemm_dq of its own format,
    F16: cuBLAS): each output is still its own product, run to run the same bits."""
    gpu = kq_gpu
    rng = rng_for("gemm_kq_runs", n_tok)
    n_in = 4096
    types = [T.Q4_K, T.Q4_K, T.Q4_K, T.Q4_K, T.Q6_K, T.Q6_K, T.Q4_0, T.F16, T.Q4_K]
    outs = (300, 520, 100, 256, 200, 1000, 72, 64, 1000)
    ws = [random_weight(t, n_out, n_in, rng) for t, n_out in zip(types, outs)]
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    ys = gpu.matmul_many([int(t) for t in types], ws, n_in, x, n_seq=n_seq)
    for i, (t, w, y) in enumerate(zip(types, ws, ys)):
        if t in KQ_MODEL:
            assert rel_err(y, f16_round(x) @ KQ_MODEL[t](w, n_in).T) < 1e-4, (i, t.name)
        else:   # f16 activations
            assert rel_err(y, x.astype(np.float64) @ dequant(t, w, n_in).T) < 2e-3, (i, t.name)
    again = gpu.matmul_many([int(t) for t in types], ws, n_in, x, n_seq=n_seq)
    assert all(same_bits(a, b) for a, b in zip(ys, again)), "not deterministic"


@pytest.mark.parametrize("t", KQ_TYPES, ids=lambda t: t.name)
def test_gemm_kq_ffn_same_bits(t):
    """The fused feed-forward op at 40 tokens on K-quant weights under the switch (gate and up in one
    gemm_dq launch, the norm and the gated activation writing its f16 input): the same bits as the
    unfused kernels under the switch (test_gemm_q8_ffn_same_bits' shapes: the grids Q4_0's take)."""
    rng = rng_for("gemm_kq_ffn", t.name)
    n_in, n_ff, n_tok = 2560, 2304, 40
    gate, up = quantized_weight(t, n_ff, n_in, rng), quantized_weight(t, n_ff, n_in, rng)
    down = quantized_weight(t, n_in, n_ff, rng)
    x, res = rng.standard_normal((2, n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    args = (int(t), gate, up, down, n_in, x, norm, 1e-5, res, "silu")
    y, _ = cuda_backend(EMBER_CUDA_GEMM_KQ="1").ffn(*args)
    y_unfused, _ = unfused_backend(EMBER_CUDA_GEMM_KQ="1").ffn(*args)
    assert np.array_equal(y.view(np.uint32), y_unfused.view(np.uint32))
    xn = ref_ops.rmsnorm(x.astype(np.float64) + res, norm, 1e-5)
    g, u = xn @ dequant(t, gate, n_in).T, xn @ dequant(t, up, n_in).T
    assert rel_err(y, ref_ops.gated_act(g, u, "silu") @ dequant(t, down, n_ff).T) < 5e-2


@pytest.mark.parametrize("t", KQ_TYPES, ids=lambda t: t.name)
def test_gemm_kq_is_opt_in(gpu_without_kq, t):
    """Without the switch K-quant batches of 9..64 tokens keep the chunked GEMV: q8_1 activations, so
    farther from the f16 model than gemm_dq's bound (the switch changes the kernel, not only its name)."""
    n_in = 4096
    w, x, y = gpu_matmul_case(gpu_without_kq, "gemm_kq_opt_in", t, 32, (256, n_in))
    assert rel_err(y, f16_round(x) @ KQ_MODEL[t](w, n_in).T) > 1e-3
