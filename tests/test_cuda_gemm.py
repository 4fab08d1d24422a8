"""The CUDA backend's quantized GEMM (cuda/gemm_q8.cu: int8 tensor cores on q8_1 activations) for
batches of 9..64 tokens of the 32-element block formats with rows wider than 2048 (narrower rows
keep the CPU-order GEMV), through Backend.matmul and the fused feed-forward op, on fresh random
data: against the float64 product of the dequantized weights, against the CPU backend (the same
per-block integer dots and products, summed in another order), and run to run (K splits summed
in a fixed order). Skipped with the reason when ember has no CUDA backend or no GPU."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import backend_reference as ref_ops
from conftest import rng_for
from test_cuda import cpu, dequant, gpu, quantized_weight, random_weight, rel_err, unfused_backend   # noqa: F401

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
N_TOK = [9, 16, 33, 64]   # each token tile: 16, 32, 64 (a partial one at 9 and 33)
# (n_out, n_in): rows not a multiple of the 128-row tile; 65 blocks (a last partial stage of the
# 4-block pipeline, metadata rows not 16-byte aligned); 4096 and 11008 wide (K split over a
# cluster).
SHAPES = [(300, 2080), (1000, 4096), (129, 11008)]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_tok", N_TOK)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemm_q8_matmul(gpu, cpu, t, n_tok, shape):
    n_out, n_in = shape
    rng = rng_for("gemm_q8", t.name, n_tok, n_out, n_in)
    w = random_weight(t, n_out, n_in, rng)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    y = gpu.matmul(int(t), w, n_in, x)
    assert y.shape == (n_tok, n_out)
    ref = x.astype(np.float64) @ dequant(t, w, n_in).T
    assert rel_err(y, ref) < 1.5e-2   # int8 activations (q8_1), as test_cuda.py's test_matmul
    assert rel_err(y, cpu.matmul(int(t), w, n_in, x)) < 1e-4   # the same products, another order
    assert np.array_equal(y.view(np.uint32), gpu.matmul(int(t), w, n_in, x).view(np.uint32)), "not deterministic"


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_1], ids=lambda t: t.name)
def test_gemm_q8_ffn_same_bits(gpu, t, monkeypatch):
    """The fused feed-forward op at 40 tokens: the norm and the gated activation write the q8_1
    blocks the GEMMs read (no quantize launch); the same bits as the unfused kernels."""
    rng = rng_for("gemm_q8_ffn", t.name)
    n_in, n_ff, n_tok = 2560, 2304, 40
    gate, up = quantized_weight(t, n_ff, n_in, rng), quantized_weight(t, n_ff, n_in, rng)
    down = quantized_weight(t, n_in, n_ff, rng)
    x, res = rng.standard_normal((2, n_tok, n_in)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    args = (int(t), gate, up, down, n_in, x, norm, 1e-5, res, "silu")
    y, _ = gpu.ffn(*args)
    y_unfused, _ = unfused_backend(monkeypatch).ffn(*args)
    assert np.array_equal(y.view(np.uint32), y_unfused.view(np.uint32))
    xn = ref_ops.rmsnorm(x.astype(np.float64) + res, norm, 1e-5)
    g, u = xn @ dequant(t, gate, n_in).T, xn @ dequant(t, up, n_in).T
    assert rel_err(y, ref_ops.gated_act(g, u, "silu") @ dequant(t, down, n_ff).T) < 5e-2   # two int8 roundings
