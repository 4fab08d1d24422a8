"""Q2_K and Q3_K on the CPU's SIMD levels (src/cpu/vec_dot_q2_q3_*.cpp): the one-token dot equals the
scalar reference bit for bit at every level this machine has (both sum integers per super-block, then
take the same float step), on fresh random blocks, blocks with extreme scales and quantized weights;
the reference is the dot of gguf's dequantized operands; and the prompt tiles give every token of a
batch the bits its one-token dot gives."""
import gguf
import gguf.quants
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from conftest import at_simd_level, kernel_module, simd_levels

K = kernel_module()
TYPES = [T.Q2_K, T.Q3_K]
# byte offsets of the fp16 fields in a block: Q2_K's d and dmin, Q3_K's d
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108]}


@pytest.fixture(params=simd_levels("avx2", "scalar"))
def level(request):
    with at_simd_level(request.param):
        yield request.param


def block_bytes(t):
    return gguf.GGML_QUANT_SIZES[t][1]


def random_row(t, n, rng, extreme=False):
    """Random block bytes (every quant and scale bit pattern) with finite fp16 scales: spread over
    decades, or (extreme) at fp16's ends: its largest finite values, subnormals, zeros, both signs."""
    nb = n // 256
    raw = rng.integers(0, 256, size=(nb, block_bytes(t)), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        if extreme:
            pick = rng.choice([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 3.1e-5, 1.0], nb)
            d = pick.astype(np.float16)
        else:
            d = (rng.uniform(-1, 1, nb) * 10.0 ** rng.uniform(-4, 0, nb)).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def activations(n, rng, extreme=False):
    x = rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 2)
    if extreme:   # a few huge values: most of a Q8_K block rounds to 0, the peak to +-127 / -128
        x[rng.integers(0, n, 4)] *= 1e6
    return x.astype(np.float32)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [256, 512, 1280, 4096])
def test_dot_is_the_scalar_reference_bit_for_bit(t, n, level, rng):
    for trial in range(8):
        extreme = trial >= 5
        if trial == 4:
            w = K.quantize(int(t), rng.standard_normal(n).astype(np.float32))
        else:
            w = random_row(t, n, rng, extreme)
        x = activations(n, rng, extreme and trial % 2 == 0)
        best, ref = K.vec_dot(int(t), w, x), K.vec_dot(int(t), w, x, impl="ref")
        assert np.float32(best).view(np.uint32) == np.float32(ref).view(np.uint32), (level, trial, best, ref)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_reference_is_the_dot_of_gguf_dequantized_operands(t, rng):
    n = 2048
    w = random_row(t, n, rng)
    x = activations(n, rng)
    wd = gguf.quants.dequantize(w.reshape(-1, block_bytes(t)), t).reshape(-1).astype(np.float64)
    np.testing.assert_array_equal(K.dequantize(int(t), w, n), wd.astype(np.float32))
    xd = K.dequantize(int(T.Q8_K), K.quantize(int(T.Q8_K), x), n).astype(np.float64)
    ref = K.vec_dot(int(t), w, x, impl="ref")
    assert abs(ref - wd @ xd) <= 1e-5 * np.abs(wd * xd).sum()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [256, 768, 1536])
def test_prompt_tiles_give_each_token_its_one_token_bits(t, n_in, level, rng):
    cpu = K.Backend("cpu", 2)
    n_out = 37   # not a whole number of row tiles nor of thread chunks
    wq = np.stack([random_row(t, n_in, rng, extreme=o % 5 == 0) for o in range(n_out)])
    for n_tok in [1, 2, 5, 16, 33]:
        x = (rng.standard_normal((n_tok, n_in)) * 10.0 ** rng.uniform(-2, 2, (n_tok, 1))).astype(np.float32)
        got = cpu.matmul(int(t), wq, n_in, x)
        assert got.shape == (n_tok, n_out)
        want = np.array([[K.vec_dot(int(t), wq[o], x[k]) for o in range(n_out)] for k in range(n_tok)], np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{level} n_tok={n_tok}")


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_bad_sizes_are_refused(t, rng):
    x = rng.standard_normal(256).astype(np.float32)
    with pytest.raises(ValueError, match=f"{t.name} weights need"):
        K.vec_dot(int(t), random_row(t, 256, rng)[:-1], x)
    with pytest.raises(ValueError, match=t.name):   # 500 is not a whole number of super-blocks
        K.vec_dot(int(t), random_row(t, 512, rng), rng.standard_normal(500).astype(np.float32))
