"""The gated delta rule of gated DeltaNet layers (Qwen3.5, Qwen3-Next), Backend::gated_delta_rule, on
every backend: float64 references in transformers' recurrent and chunked forms, a prompt in one call
equal to its tokens one by one with the state carried, the GPU beside the CPU, and bad shapes."""
import numpy as np
import pytest

import backend_reference as ref
from conftest import kernel_backend, kernel_module

K = kernel_module()
c = np.ascontiguousarray

# (n_k_heads, n_v_heads, head_k, head_v): one head, GQA of k heads to v heads, widths that leave a
# part-filled warp of state columns on the GPU, and Qwen3.5's heads of 128.
SHAPES = [(1, 1, 8, 8), (2, 6, 16, 24), (3, 6, 40, 33), (2, 4, 128, 128)]


@pytest.fixture(params=["cpu", "cuda"])
def be(request):
    return kernel_backend(request.param)


def inputs(rng, n_tok, n_k, n_v, hk, hv):
    """Projections as a layer gives them (q, k not yet normalized), decays in (0, 1) and betas in
    (0, 1) as the layer's -exp(A_log) * softplus(a + dt_bias) and sigmoid(b) make them, and a state
    left by earlier tokens."""
    f = np.float32
    q = rng.standard_normal((n_tok, n_k * hk)).astype(f) * f(rng.uniform(0.1, 3))
    k = rng.standard_normal((n_tok, n_k * hk)).astype(f) * f(rng.uniform(0.1, 3))
    v = rng.standard_normal((n_tok, n_v * hv)).astype(f)
    g = -rng.uniform(0.0, 1.5, (n_tok, n_v)).astype(f)
    beta = rng.uniform(0.0, 1.0, (n_tok, n_v)).astype(f)
    state = (rng.standard_normal((n_v, hk, hv)) * 0.3).astype(f)
    return q, k, v, g, beta, state


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("n_tok", [1, 5, 70])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(be, shape, n_tok, rng):
    """Output and final state equal the float64 rule (f32 sums over head_k)."""
    n_k, n_v, hk, hv = shape
    q, k, v, g, beta, state = inputs(rng, n_tok, *shape)
    out, new_state = be.gated_delta_rule(q, k, v, g, beta, state, n_k)
    want_out, want_state = ref.gated_delta_rule(q, k, v, g, beta, state, n_k)
    assert out.shape == (n_tok, n_v * hv) and new_state.shape == state.shape
    assert rel_err(out, want_out) < 2e-5, f"out: {rel_err(out, want_out):.3g}"
    assert rel_err(new_state, want_state) < 2e-5, f"state: {rel_err(new_state, want_state):.3g}"


@pytest.mark.parametrize("n_tok", [1, 63, 64, 150])
def test_reference_forms_agree(n_tok, rng):
    """transformers' two formulations, token by token and chunked (the UT transform within chunks of
    64), give the same rule: the reference the ops are held to is the models' rule."""
    q, k, v, g, beta, state = (x.astype(np.float64) for x in inputs(rng, n_tok, 2, 6, 16, 24))
    a_out, a_state = ref.gated_delta_rule(q, k, v, g, beta, state, 2)
    b_out, b_state = ref.gated_delta_rule_chunked(q, k, v, g, beta, state, 2)
    np.testing.assert_allclose(b_out, a_out, rtol=0, atol=1e-10 * np.abs(a_out).max())
    np.testing.assert_allclose(b_state, a_state, rtol=0, atol=1e-10 * np.abs(a_state).max())


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_prompt_equals_tokens_one_by_one(be, shape, rng):
    """A prompt in one call gives the bits of its tokens one call each with the state carried
    (decode continues a prefill exactly), and of the prompt split anywhere."""
    n_k, n_v, hk, hv = shape
    n_tok = 23
    q, k, v, g, beta, state = inputs(rng, n_tok, *shape)
    whole, whole_state = be.gated_delta_rule(q, k, v, g, beta, state, n_k)
    for cuts in ([*range(1, n_tok)], sorted(rng.choice(np.arange(1, n_tok), 3, replace=False))):
        s, parts = state, []
        for a, b in zip([0, *cuts], [*cuts, n_tok]):
            out, s = be.gated_delta_rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], s, n_k)
            parts.append(out)
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        np.testing.assert_array_equal(s, whole_state)


def test_no_tokens_keeps_the_state(be, rng):
    q, k, v, g, beta, state = inputs(rng, 0, 2, 4, 16, 16)
    out, new_state = be.gated_delta_rule(q, k, v, g, beta, state, 2)
    assert out.shape == (0, 64)
    np.testing.assert_array_equal(new_state, state)


def test_cuda_matches_cpu(rng):
    """The GPU's rule beside the CPU's on Qwen3.5's head shape over a prompt."""
    gpu, cpu = kernel_backend("cuda"), kernel_backend("cpu")
    q, k, v, g, beta, state = inputs(rng, 200, 16, 32, 128, 128)
    got_out, got_state = gpu.gated_delta_rule(q, k, v, g, beta, state, 16)
    want_out, want_state = cpu.gated_delta_rule(q, k, v, g, beta, state, 16)
    assert rel_err(got_out, want_out) < 1e-5 and rel_err(got_state, want_state) < 1e-5


def test_bad_shapes(be, rng):
    q, k, v, g, beta, state = inputs(rng, 3, 2, 6, 16, 24)
    with pytest.raises(ValueError, match="n_v_heads 6 must be a multiple of n_k_heads 4"):
        be.gated_delta_rule(c(q[:, :16]), c(k[:, :16]), v, g, beta, state, 4)
    with pytest.raises(ValueError, match="heads and head widths must be positive"):
        be.gated_delta_rule(q, k, v, g, beta, state, 0)
    with pytest.raises(ValueError, match="q must be \\[3, 32\\]"):
        be.gated_delta_rule(c(q[:, :30]), k, v, g, beta, state, 2)
    with pytest.raises(ValueError, match="k must be \\[3, 32\\]"):
        be.gated_delta_rule(q, k[:2], v, g, beta, state, 2)
    with pytest.raises(ValueError, match="v must be \\[3, 144\\]"):
        be.gated_delta_rule(q, k, c(v[:, :140]), g, beta, state, 2)
    with pytest.raises(ValueError, match="g must be \\[3, 6\\]"):
        be.gated_delta_rule(q, k, v, c(g[:, :5]), beta, state, 2)
    with pytest.raises(ValueError, match="beta must be \\[3, 6\\]"):
        be.gated_delta_rule(q, k, v, g, beta.ravel(), state, 2)
    with pytest.raises(ValueError, match="state must be \\[n_v_heads, head_k, head_v\\]"):
        be.gated_delta_rule(q, k, v, g, beta, state.reshape(6, -1), 2)


def test_cuda_head_k_limit(rng):
    gpu = kernel_backend("cuda")
    q, k, v, g, beta, state = inputs(rng, 2, 1, 1, 264, 8)
    with pytest.raises(ValueError, match="head_k 264 over 256"):
        gpu.gated_delta_rule(q, k, v, g, beta, state, 1)
