"""CPU batched matmul against per-token matmuls: every output must be bit-identical, so a token's
result never depends on how its prompt was split into batches. Types whose fast kernels have a
single-token form take them for every batch (test_gemm_fast_cpu.py); the others go through tiles
(src/cpu/gemm_*.cpp) that reproduce vec_dot. Every test runs at this machine's level (the AVX-512
tiles where it has them) and again at the avx2 level (EMBER_SIMD, set in-process)."""
import gguf
import numpy as np
import pytest

from conftest import SINGLE_TOKEN_FAST, each_simd_level, kernel_module

K = kernel_module()

# The tiled types first; F16 pins down that the fallback loop stays exact too.
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"]
# Row lengths give every remainder of blocks of 32 modulo 4 (the legacy kernels step 4 blocks
# at a time, then a pair, then a single block); the 256-multiples (1, 3 and 6 super-blocks)
# run the K-quant tiles.
N_IN = [1536, 768, 576, 256, 96, 160, 32]


level = each_simd_level("avx2")


@pytest.fixture(scope="module")
def cpu(level):
    return K.Backend("cpu", 2)


def per_token(cpu, type_id, wq, n_in, x):
    return np.concatenate([cpu.matmul(type_id, wq, n_in, x[t:t + 1]) for t in range(len(x))])


def block_elems(name):
    return 256 if name.endswith("_K") or name == "IQ4_XS" else 32


# Only row lengths of whole blocks of the type.
@pytest.mark.parametrize("name,n_in", [(t, n) for n in N_IN for t in TYPES if n % block_elems(t) == 0])
def test_batched_matmul_is_bit_identical_to_per_token(cpu, name, n_in, rng):
    qtype = gguf.GGMLQuantizationType[name]
    n_out = 37   # not a whole number of row tiles nor of thread chunks
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    wq = K.quantize(int(qtype), w.ravel()).reshape(n_out, -1)
    # tiles of 8 tokens, of 4 after them (13: both, then one token through vec_dot), or neither
    for n_tok in [1, 2, 5, 13, 16, 33]:
        # per-token scales spread over decades, as hidden states are
        x = (rng.standard_normal((n_tok, n_in)) * 10.0 ** rng.uniform(-2, 2, (n_tok, 1))).astype(np.float32)
        got = cpu.matmul(int(qtype), wq, n_in, x)
        want = per_token(cpu, int(qtype), wq, n_in, x)
        assert got.shape == (n_tok, n_out)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                      err_msg=f"{name} n_in={n_in} n_tok={n_tok}")


# (the SINGLE_TOKEN_FAST types: test_gemm_fast_cpu.py compares their single-token kernel with vec_dot)
@pytest.mark.parametrize("name,n_in", [(t, n) for n in N_IN for t in TYPES if n % block_elems(t) == 0])
def test_single_token_matmul_is_vec_dot(cpu, level, name, n_in, rng):
    """One token (decode): each output is exactly the kernel's vec_dot of its row, however the
    rows are handed out or tiled."""
    if name in SINGLE_TOKEN_FAST.get(level, set()):
        pytest.skip(f"{name} takes its single-token fast kernel at the {level} level")
    qtype = gguf.GGMLQuantizationType[name]
    n_out = 37
    wq = K.quantize(int(qtype), rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
    x = (rng.standard_normal((1, n_in)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
    got = cpu.matmul(int(qtype), wq, n_in, x)[0]
    want = np.array([K.vec_dot(int(qtype), wq[o], x[0], impl="best") for o in range(n_out)], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{name} n_in={n_in}")


def test_large_batch_spans_thread_chunks(cpu, rng):
    """A model-sized shape: many row chunks over both threads, a tile remainder of tokens."""
    qtype = gguf.GGMLQuantizationType.Q4_1
    n_in, n_out, n_tok = 576, 1536, 67
    wq = K.quantize(int(qtype), rng.standard_normal(n_out * n_in).astype(np.float32)).reshape(n_out, -1)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    got = cpu.matmul(int(qtype), wq, n_in, x)
    want = per_token(cpu, int(qtype), wq, n_in, x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

