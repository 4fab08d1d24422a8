"""The causal short convolution of gated DeltaNet, Mamba2 and LFM2 layers (Backend::short_conv) on
every backend: against the float64 reference, a prompt in one call equal to its tokens one by one
with the state carried, the GPU beside the CPU, and bad shapes."""
import numpy as np
import pytest

import backend_reference as ref
from conftest import ROOT, kernel_backend, kernel_module

K = kernel_module()
c = np.ascontiguousarray
LFM2 = ROOT / "tests" / "reference" / "short_conv" / "lfm2.npz"

# (channels, kernel): one channel, LFM2's kernel of 3, the kernel of 4 of Qwen3.5 and Mamba2 at
# widths that leave part-filled vectors and CTAs, a kernel of 1 (no state), and a long one.
SHAPES = [(1, 4), (96, 3), (200, 4), (1037, 4), (33, 1), (70, 9)]


# The CPU at its best SIMD level and at the scalar one (the kernels differ), and the GPU.
@pytest.fixture(params=["cpu", "cpu-scalar", "cuda"])
def be(request):
    name, _, level = request.param.partition("-")
    return kernel_backend(name, {"EMBER_SIMD": level} if level else None)


def inputs(rng, n_tok, channels, kernel):
    """Activations, weights and bias as a layer's projection and conv1d give them, and a state
    left by earlier tokens."""
    f = np.float32
    x = rng.standard_normal((n_tok, channels)).astype(f) * f(rng.uniform(0.3, 3))
    w = (rng.standard_normal((channels, kernel)) / np.sqrt(kernel)).astype(f)
    bias = (rng.standard_normal(channels) * 0.5).astype(f)
    state = rng.standard_normal((kernel - 1, channels)).astype(f)
    return x, w, bias, state


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def conv_err(got, want, x, w, bias, state):
    """The error relative to the convolution of the magnitudes: the rounding scale of f32 sums,
    where a few outputs (one channel, one token) may cancel to near zero."""
    assert np.all(np.isfinite(got)), "non-finite output"
    mag, _ = ref.short_conv(abs(x), abs(w), None if bias is None else abs(bias), abs(state), False)
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(mag))


@pytest.mark.parametrize("silu", [False, True], ids=["linear", "silu"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("n_tok", [1, 2, 7, 300])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(be, shape, n_tok, with_bias, silu, rng):
    """Output and the carried state against float64; the state is the last kernel - 1 inputs
    exactly, also when the call has fewer tokens than that."""
    x, w, bias, state = inputs(rng, n_tok, *shape)
    bias = bias if with_bias else None
    y, new_state = be.short_conv(x, w, bias, state, silu)
    want_y, want_state = ref.short_conv(x, w, bias, state, silu)
    assert y.shape == x.shape and new_state.shape == state.shape
    assert conv_err(y, want_y, x, w, bias, state) < 1e-6, f"y: {conv_err(y, want_y, x, w, bias, state):.3g}"
    np.testing.assert_array_equal(new_state, want_state.astype(np.float32))


@pytest.mark.parametrize("silu", [False, True], ids=["linear", "silu"])
@pytest.mark.parametrize("shape", [(96, 3), (1037, 4), (70, 9)], ids=lambda s: "x".join(map(str, s)))
def test_prompt_equals_tokens_one_by_one(be, shape, silu, rng):
    """A prompt in one call gives the bits of its tokens one call each with the state carried
    (decode continues a prefill exactly), and of the prompt split anywhere, also into pieces shorter
    than the kernel."""
    n_tok = 29
    x, w, bias, state = inputs(rng, n_tok, *shape)
    whole, whole_state = be.short_conv(x, w, bias, state, silu)
    for cuts in ([*range(1, n_tok)], sorted(rng.choice(np.arange(1, n_tok), 5, replace=False))):
        s, parts = state, []
        for a, b in zip([0, *cuts], [*cuts, n_tok]):
            out, s = be.short_conv(x[a:b], w, bias, s, silu)
            parts.append(out)
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        np.testing.assert_array_equal(s, whole_state)


@pytest.mark.parametrize("cuts", [(), (1, 2, 3), (6,)], ids=["whole", "first_tokens_one_by_one", "resumed_at_6"])
def test_lfm2_block_matches_transformers(be, cuts):
    """transformers' LFM2 short-convolution block (random weights, a prompt of 17 tokens) equals one
    built from short_conv with no bias and no activation: in_proj into B, C, x; the convolution of
    B * x (weights [channels][kernel], a zero state first); C times it; out_proj. Split prompts carry
    the state."""
    m = np.load(LFM2)
    width = m["hidden"].shape[1]
    proj = m["hidden"] @ m["in_proj"].T
    B, C, x = proj[:, :width], proj[:, width:2 * width], proj[:, 2 * width:]
    bx = c(B * x)
    state = np.zeros((m["conv_w"].shape[1] - 1, width), np.float32)
    parts = []
    for a, b in zip([0, *cuts], [*cuts, len(bx)]):
        y, state = be.short_conv(c(bx[a:b]), m["conv_w"], None, state, False)
        parts.append(y)
    out = (C * np.concatenate(parts)) @ m["out_proj"].T
    assert rel_err(out, m["out"]) < 1e-5, f"{rel_err(out, m['out']):.3g}"
    np.testing.assert_array_equal(state, bx[-2:])


def test_no_tokens_keeps_the_state(be, rng):
    x, w, bias, state = inputs(rng, 0, 40, 4)
    y, new_state = be.short_conv(x, w, bias, state, True)
    assert y.shape == (0, 40)
    np.testing.assert_array_equal(new_state, state)


def test_state_starts_empty(be, rng):
    """A sequence's first tokens see zeros before them (the state a slot starts with): the same
    as the prompt padded on the left by kernel - 1 zero rows."""
    x, w, bias, _ = inputs(rng, 12, 64, 4)
    y, new_state = be.short_conv(x, w, bias, np.zeros((3, 64), np.float32), True)
    padded, _ = be.short_conv(np.concatenate([np.zeros((3, 64), np.float32), x]), w, bias,
                              np.zeros((3, 64), np.float32), True)
    np.testing.assert_array_equal(y, padded[3:])
    np.testing.assert_array_equal(new_state, x[-3:])


def test_cuda_matches_cpu(rng):
    """The GPU's convolution beside the CPU's on a Qwen3.5-sized layer over a prompt: products and
    sums rounded in the CPU's order."""
    gpu, cpu = kernel_backend("cuda"), kernel_backend("cpu")
    x, w, bias, state = inputs(rng, 200, 8192, 4)
    got_y, got_state = gpu.short_conv(x, w, None, state, True)
    want_y, want_state = cpu.short_conv(x, w, None, state, True)
    assert rel_err(got_y, want_y) < 1e-6
    np.testing.assert_array_equal(got_state, want_state)


def test_bad_shapes(be, rng):
    x, w, bias, state = inputs(rng, 3, 16, 4)
    with pytest.raises(ValueError, match="x must be \\[n_tok, channels\\]"):
        be.short_conv(x.ravel(), w, bias, state)
    with pytest.raises(ValueError, match="w must be \\[16, kernel\\]"):
        be.short_conv(x, c(w[:8]), bias, state)
    with pytest.raises(ValueError, match="kernel must be positive, got 0"):
        be.short_conv(x, c(w[:, :0]), bias, state)
    with pytest.raises(ValueError, match="channels must be positive, got 0"):
        be.short_conv(c(x[:, :0]), c(w[:0]), None, c(state[:, :0]))
    with pytest.raises(ValueError, match="state must be \\[3, 16\\]"):
        be.short_conv(x, w, bias, c(state[:2]))
    with pytest.raises(ValueError, match="state must be \\[3, 16\\]"):
        be.short_conv(x, w, bias, c(state.T))
    with pytest.raises(ValueError, match="bias must be \\[16\\]"):
        be.short_conv(x, w, bias[:15], state)
