"""Mamba2's selective scan (Nemotron-H, Granite 4), Backend::ssm_scan, on every backend: against
transformers' Mamba2 scan functions (tests/reference/ssm_scan, tools/gen_ssm_references.py) and
the float64 recurrence, a prompt in one call equal to its tokens one by one with the state carried,
the GPU beside the CPU, and bad shapes."""
import numpy as np
import pytest

import backend_reference as ref
from conftest import ROOT, kernel_backend, kernel_module

K = kernel_module()
c = np.ascontiguousarray
HF = ROOT / "tests" / "reference" / "ssm_scan" / "mamba2.npz"

# (n_head, head_dim, d_state, n_group): one head, grouped B and C at widths that leave part-filled
# vectors, warps and CTAs, and Nemotron-H's and Granite 4's heads (64 wide, states of 128).
SHAPES = [(1, 1, 8, 1), (6, 10, 20, 3), (4, 16, 37, 2), (16, 64, 128, 8), (8, 64, 256, 1)]


# The CPU at its best SIMD level and at the scalar one (the kernels differ), and the GPU.
@pytest.fixture(params=["cpu", "cpu-scalar", "cuda"])
def be(request):
    name, _, level = request.param.partition("-")
    return kernel_backend(name, {"EMBER_SIMD": level} if level else None)


def inputs(rng, n_tok, n_head, head_dim, d_state, n_group):
    """The convolution's output (x, B, C), raw time steps, A = -exp(A_log), dt_bias and D as a
    Mamba2 layer holds them, and a state left by earlier tokens."""
    f = np.float32
    xbc = rng.standard_normal((n_tok, n_head * head_dim + 2 * n_group * d_state)).astype(f)
    dt = rng.uniform(-5, 2, (n_tok, n_head)).astype(f)
    A = -rng.uniform(1, 16, n_head).astype(f)
    dt_bias = rng.uniform(-1, 1, n_head).astype(f)
    D = rng.standard_normal(n_head).astype(f)
    state = (rng.standard_normal((n_head, head_dim, d_state)) * 0.5).astype(f)
    return xbc, dt, A, dt_bias, D, state


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def scan_errs(got_y, got_state, xbc, dt, A, dt_bias, D, state, n_group):
    """Errors of y and the state against float64, relative to the scan of the magnitudes (the
    rounding scale of the f32 sums), where a few outputs (one head row, one token) may cancel to
    near zero."""
    want_y, want_state = ref.ssm_scan(xbc, dt, A, dt_bias, D, state, n_group)
    mag_y, mag_state = ref.ssm_scan(abs(xbc), dt, A, dt_bias, None if D is None else abs(D), abs(state), n_group)
    for got in (got_y, got_state):
        assert np.all(np.isfinite(got)), "non-finite output"
    return (float(np.linalg.norm(got_y - want_y) / np.linalg.norm(mag_y)),
            float(np.linalg.norm(got_state - want_state) / np.linalg.norm(mag_state)))


@pytest.mark.parametrize("n_tok", [1, 5, 70])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(be, shape, n_tok, rng):
    """Output and final state equal the float64 recurrence (f32 sums over d_state)."""
    xbc, dt, A, dt_bias, D, state = inputs(rng, n_tok, *shape)
    y, new_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, shape[3])
    assert y.shape == (n_tok, shape[0] * shape[1]) and new_state.shape == state.shape
    err_y, err_state = scan_errs(y, new_state, xbc, dt, A, dt_bias, D, state, shape[3])
    assert err_y < 1e-5 and err_state < 1e-5, f"y: {err_y:.3g}, state: {err_state:.3g}"


@pytest.mark.parametrize("optional", ["no_dt_bias", "no_D"])
def test_optional_inputs(be, optional, rng):
    xbc, dt, A, dt_bias, D, state = inputs(rng, 9, 6, 10, 20, 3)
    dt_bias, D = (None, D) if optional == "no_dt_bias" else (dt_bias, None)
    y, new_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, 3)
    assert max(scan_errs(y, new_state, xbc, dt, A, dt_bias, D, state, 3)) < 1e-5


@pytest.mark.parametrize("case", ["groups2", "group1"])
def test_matches_transformers(be, case):
    """The Mamba2 mixer's scan as transformers computes it, both forms (chunked over a prompt and
    its decode update token by token), from the same state: the layouts (x then B then C, heads
    reading groups h // (n_head / n_group)), A = -exp(A_log), softplus(dt + dt_bias) and the D skip
    are the models'."""
    z = np.load(HF)
    g = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(case + "/")}
    y, new_state = be.ssm_scan(g["xbc"], g["dt"], g["A"], g["dt_bias"], g["D"], g["state"], int(g["n_group"]))
    for form in ("chunked", "steps"):
        assert rel_err(y, g[f"y_{form}"]) < 1e-5, f"y vs {form}: {rel_err(y, g[f'y_{form}']):.3g}"
        assert rel_err(new_state, g[f"state_{form}"]) < 1e-5, f"state vs {form}"


def test_reference_matches_transformers():
    """The float64 recurrence the ops are held to is transformers' scan (to its f32 rounding)."""
    z = np.load(HF)
    for case in ("groups2", "group1"):
        g = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(case + "/")}
        y, s = ref.ssm_scan(g["xbc"], g["dt"], g["A"], g["dt_bias"], g["D"], g["state"], int(g["n_group"]))
        for form in ("chunked", "steps"):
            assert rel_err(g[f"y_{form}"], y) < 1e-6 and rel_err(g[f"state_{form}"], s) < 1e-6


def mamba2_mixer(be, hidden, m, cuts=()):
    """A Mamba2 mixer from the contract's ops: in_proj, Backend::short_conv (bias, SiLU) and
    Backend::ssm_scan from zero states, the SiLU-gated RMSNorm over n_group groups, out_proj; the
    prompt in pieces at `cuts` with both states carried, as a prefix cache resumes one."""
    n_head, head_dim, d_state, n_group = (int(v) for v in m["shape"])
    inner, conv_dim = n_head * head_dim, n_head * head_dim + 2 * n_group * d_state
    proj = hidden @ m["in_proj"].T
    z, xbc_in, dt = proj[:, :inner], c(proj[:, inner:inner + conv_dim]), c(proj[:, inner + conv_dim:])
    conv_state = np.zeros((m["conv_w"].shape[1] - 1, conv_dim), np.float32)
    ssm_state = np.zeros((n_head, head_dim, d_state), np.float32)
    ys = []
    for a, b in zip([0, *cuts], [*cuts, len(hidden)]):
        xbc, conv_state = be.short_conv(c(xbc_in[a:b]), m["conv_w"], m["conv_b"], conv_state, True)
        y, ssm_state = be.ssm_scan(xbc, c(dt[a:b]), m["A"], m["dt_bias"], m["D"], ssm_state, n_group)
        ys.append(y)
    y = np.concatenate(ys).astype(np.float64) * ref.silu(z)
    groups = y.reshape(len(y), n_group, -1)
    y = (groups / np.sqrt((groups * groups).mean(-1, keepdims=True) + float(m["eps"]))).reshape(len(y), -1)
    return (y * m["norm"]) @ m["out_proj"].T.astype(np.float64)


@pytest.mark.parametrize("cuts", [(), (8,), (5, 13, 20)], ids=["whole", "resumed_at_8", "in_four_pieces"])
def test_mamba2_mixer_matches_transformers(be, cuts):
    """A whole Mamba2Mixer of transformers (random weights, a prompt of 21 tokens, its chunked
    path) equals one built from short_conv and ssm_scan: the conv1d weight as [channels][kernel],
    the projection's z | xBC | dt split and the xBC rows the scan reads are the models'. Split
    prompts carry both states, as a prefix cache resuming from a snapshot does."""
    z = np.load(HF)
    m = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("mixer/")}
    out = mamba2_mixer(be, m["hidden"], m, cuts)
    assert rel_err(out, m["out"]) < 1e-5, f"{rel_err(out, m['out']):.3g}"


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_prompt_equals_tokens_one_by_one(be, shape, rng):
    """A prompt in one call gives the bits of its tokens one call each with the state carried
    (decode continues a prefill exactly), and of the prompt split anywhere."""
    n_tok = 23
    xbc, dt, A, dt_bias, D, state = inputs(rng, n_tok, *shape)
    whole, whole_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, shape[3])
    for cuts in ([*range(1, n_tok)], sorted(rng.choice(np.arange(1, n_tok), 3, replace=False))):
        s, parts = state, []
        for a, b in zip([0, *cuts], [*cuts, n_tok]):
            out, s = be.ssm_scan(xbc[a:b], dt[a:b], A, dt_bias, D, s, shape[3])
            parts.append(out)
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        np.testing.assert_array_equal(s, whole_state)


def test_no_tokens_keeps_the_state(be, rng):
    xbc, dt, A, dt_bias, D, state = inputs(rng, 0, 4, 8, 16, 2)
    y, new_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, 2)
    assert y.shape == (0, 32)
    np.testing.assert_array_equal(new_state, state)


def test_large_steps(be, rng):
    """Time steps past softplus's threshold (dt itself) and decays that underflow to zero stay
    finite: the state forgets everything but the token."""
    xbc, dt, A, dt_bias, D, state = inputs(rng, 4, 6, 10, 20, 3)
    dt[:] = rng.uniform(30, 90, dt.shape)
    y, new_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, 3)
    assert max(scan_errs(y, new_state, xbc, dt, A, dt_bias, D, state, 3)) < 1e-5


def test_cuda_matches_cpu(rng):
    """The GPU's scan beside the CPU's on Nemotron-H's head shape over a prompt."""
    gpu, cpu = kernel_backend("cuda"), kernel_backend("cpu")
    xbc, dt, A, dt_bias, D, state = inputs(rng, 200, 64, 64, 128, 8)
    got_y, got_state = gpu.ssm_scan(xbc, dt, A, dt_bias, D, state, 8)
    want_y, want_state = cpu.ssm_scan(xbc, dt, A, dt_bias, D, state, 8)
    assert rel_err(got_y, want_y) < 1e-5 and rel_err(got_state, want_state) < 1e-5


def test_bad_shapes(be, rng):
    xbc, dt, A, dt_bias, D, state = inputs(rng, 3, 6, 10, 20, 3)   # xbc rows 60 + 120
    with pytest.raises(ValueError, match="n_head 6 must be a multiple of n_group 4"):
        be.ssm_scan(xbc, dt, A, dt_bias, D, state, 4)
    with pytest.raises(ValueError, match="heads, widths and groups must be positive"):
        be.ssm_scan(xbc, dt, A, dt_bias, D, state, 0)
    with pytest.raises(ValueError, match="xbc must be \\[3, 180\\]"):
        be.ssm_scan(c(xbc[:, :170]), dt, A, dt_bias, D, state, 3)
    with pytest.raises(ValueError, match="xbc must be \\[n_tok"):
        be.ssm_scan(xbc.ravel(), dt, A, dt_bias, D, state, 3)
    with pytest.raises(ValueError, match="dt must be \\[3, 6\\]"):
        be.ssm_scan(xbc, dt[:2], A, dt_bias, D, state, 3)
    with pytest.raises(ValueError, match="A must be \\[6\\]"):
        be.ssm_scan(xbc, dt, A[:5], dt_bias, D, state, 3)
    with pytest.raises(ValueError, match="dt_bias must be \\[6\\]"):
        be.ssm_scan(xbc, dt, A, dt_bias[:1], D, state, 3)
    with pytest.raises(ValueError, match="D must be \\[6\\]"):
        be.ssm_scan(xbc, dt, A, dt_bias, c(np.tile(D, 2)), state, 3)
    with pytest.raises(ValueError, match="state must be \\[n_head, head_dim, d_state\\]"):
        be.ssm_scan(xbc, dt, A, dt_bias, D, state.reshape(6, -1), 3)


def test_cuda_d_state_limit(rng):
    gpu = kernel_backend("cuda")
    xbc, dt, A, dt_bias, D, state = inputs(rng, 2, 1, 4, 264, 1)
    with pytest.raises(ValueError, match="d_state 264 over 256"):
        gpu.ssm_scan(xbc, dt, A, dt_bias, D, state, 1)
