"""CPU batched matmul of F32, F16 and BF16 weights (src/cpu/gemm_float_avx*.cpp: tiles of rows x
tokens that convert each weight vector once for several tokens): every output bit-identical to the
per-token matmul (vec_dot), and within float rounding of a float64 reference of the dequantized
weights, on fresh random data. Row lengths leave every remainder the tiles' 16- and 32-element
steps and masked or scalar tails meet; row and token counts leave tiles over. Runs at this
machine's level and again at the avx2 level (EMBER_SIMD, set in-process)."""
import gguf
import numpy as np
import pytest

from conftest import each_simd_level, kernel_module

K = kernel_module()
TYPES = ["F32", "F16", "BF16"]
N_IN = [384, 1536, 100, 33, 7, 16, 48]
level = each_simd_level("avx2")


@pytest.fixture(scope="module")
def cpu(level):
    return K.Backend("cpu", 2)


def dequantized(name, wq, n_out, n_in):
    if name == "F32":
        return wq.view(np.float32).reshape(n_out, n_in).astype(np.float64)
    if name == "F16":
        return wq.view(np.float16).reshape(n_out, n_in).astype(np.float64)
    return (wq.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n_out, n_in).astype(np.float64)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n_in", N_IN)
def test_batched_float_matmul_is_vec_dot_and_near_float64(cpu, name, n_in, rng):
    qtype = int(gguf.GGMLQuantizationType[name])
    n_out = 37   # not a whole number of row tiles nor of thread chunks
    wq = K.quantize(qtype, rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
    w64 = dequantized(name, wq, n_out, n_in)
    for n_tok in (2, 3, 5, 16, 33):
        x = (rng.standard_normal((n_tok, n_in)) * 10.0 ** rng.uniform(-2, 2, (n_tok, 1))).astype(np.float32)
        got = cpu.matmul(qtype, wq, n_in, x)
        want = np.concatenate([cpu.matmul(qtype, wq, n_in, x[t:t + 1]) for t in range(n_tok)])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                      err_msg=f"{name} n_in={n_in} n_tok={n_tok}")
        ref = x.astype(np.float64) @ w64.T
        bound = 1e-6 * n_in * (np.abs(x).astype(np.float64) @ np.abs(w64).T)
        assert np.all(np.abs(got - ref) <= bound + 1e-30), f"{name} n_in={n_in} n_tok={n_tok}"


def test_model_sized_batch(cpu, rng):
    """MiniLM's feed-forward shape: many row chunks over both threads, a token remainder."""
    qtype = int(gguf.GGMLQuantizationType.F16)
    n_in, n_out, n_tok = 384, 1536, 67
    wq = K.quantize(qtype, rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    got = cpu.matmul(qtype, wq, n_in, x)
    want = np.concatenate([cpu.matmul(qtype, wq, n_in, x[t:t + 1]) for t in range(n_tok)])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
