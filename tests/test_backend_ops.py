"""The backend conformance suite: every op and tensor type of the backend contract
(src/backend/backend.h) on every backend in the registry, and under each kernel choice its switches
make, against float64 numpy references on fresh random data. New types and ops land here:
test_every_contract_op_is_covered and test_every_type_is_covered fail until they do."""
import functools
import re

import gguf.quants
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

import backend_reference as ref
from conftest import ROOT, kernel_module

K = kernel_module()

WEIGHT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                T.Q6_K, T.MXFP4, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS,
                T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.NVFP4]
# Block formats the kernels quantize activations to; never the type of a weight in a model.
ACTIVATION_TYPES = {"Q8_1", "Q8_K"}
KV_TYPES = ["f16", "q8_0", "f32", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]
# KV types held as ggml blocks of 32 values (head_dim a multiple of 32).
BLOCK_KV_TYPES = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)

# What each backend in the registry takes. Every other combination must fail with the error
# matched here (the suite checks it instead of skipping the combination).
SUPPORT = {
    "cpu": {"weights": WEIGHT_TYPES, "kv": KV_TYPES, "host": True},
    "cuda": {"weights": WEIGHT_TYPES, "kv": KV_TYPES, "host": False},
}
UNSUPPORTED = {
    "cuda": {"weights": r"weight type .* not (supported|run) by the CUDA backend",
             "kv": r"keeps KV in f16, bf16, f32, q8_0"},
}

# Bounds on the relative L2 error ||got - want|| / ||want|| against the float64 reference (weights
# as gguf dequantizes them, K and V as their cache type rounds them). "*": any backend, the loosest
# rounding the contract allows there; a backend's own entry is tighter where it rounds less.
# add, add_bias, argmax_rows, copy, prepare_vector, kv_store of given rows and the fused ops'
# residual sums are exact: the suite compares their bits.
TOLERANCE = {
    # f32 products summed in f32; GPU batches past the GEMV sum in other tile orders.
    ("matmul", "F32"): {"*": 1e-4, "cpu": 1e-5},
    # GPU tensor-core paths round activations to f16 (2^-11 relative each); the CPU keeps them f32.
    ("matmul", "F16"): {"*": 2e-3, "cpu": 1e-5},
    ("matmul", "BF16"): {"*": 2e-3, "cpu": 1e-5},
    # Activations rounded to 8-bit blocks (q8_0, q8_1, q8_K: up to half a step of amax / 127 per
    # value, 0.5-0.7% of the norm, more on one token through the heavy rows of random K-quant bytes:
    # 256 outputs of Q4_K reach 3.6% in 2,000 draws, 2.4% at the 99th percentile), or to f16 on the
    # GPU's dequantizing GEMM.
    ("matmul", "quant"): {"*": 4e-2},
    # Against the product of the weights and the activations rounded as ember's scalar quantizer
    # rounds them to the weight's vec_dot_type (ROUNDS_ACTIVATIONS backends): f32 sums of the same
    # products in another order; q8_1 (Q4_1, Q5_1) also keeps its block sum as f16.
    ("matmul", "rounded"): {"*": 2e-4},
    # Two matmuls in a row, the second on the gated activation's output; block types round both
    # inputs, and the heavy rows of random 2-6 bit weights reach 4% (Q2_K) on one token.
    ("ffn", "F32"): {"*": 2e-4, "cpu": 2e-5},
    ("ffn", "F16"): {"*": 4e-3, "cpu": 2e-5},
    ("ffn", "BF16"): {"*": 4e-3, "cpu": 2e-5},
    ("ffn", "quant"): {"*": 1e-1},
    # The feed-forward's bounds: each token's output is a weighted sum of such feed-forwards.
    ("moe", "F32"): {"*": 2e-4, "cpu": 2e-5},
    ("moe", "F16"): {"*": 4e-3, "cpu": 2e-5},
    ("moe", "BF16"): {"*": 4e-3, "cpu": 2e-5},
    ("moe", "quant"): {"*": 1e-1},
    # Sums of squares in f32 or wider over rows of up to a few thousand.
    ("rmsnorm", None): {"*": 1e-5},
    # Angles of positions up to 8000: an f32 angle of the fastest pair is up to 8000 * 2^-24 rad
    # off, one pair of head_dim / 2 (1e-4 of a head's norm).
    ("rope", None): {"*": 3e-4},
    # Mean and variance in f32 (GPU) or f64 (CPU) over rows of up to a few thousand.
    ("layernorm", None): {"*": 1e-5},
    # erff, tanhf and expf to an ulp or two.
    ("unary", None): {"*": 1e-6},
    # f32 scores, exponentials and sums over up to a few hundred keys.
    ("encoder_attention", None): {"*": 1e-5},
    # expf and tanhf to an ulp or two, relative to |g u| (test_gated_act says why).
    ("gated_act", None): {"*": 1e-6},
    # q rounded to f16 for an f16 K and the probabilities for an f16 V (as llama.cpp).
    ("attention", "f16"): {"*": 3e-3},
    # GPU decode over a q8_0 cache rounds q to int8 per 32 dims (about 0.5% a value, which a peaked
    # softmax amplifies: 1.5% seen over a long context), prompts an f16 copy; the CPU keeps q and
    # the probabilities in f32.
    ("attention", "q8_0"): {"*": 3e-2, "cpu": 1e-5},
    ("attention", "f32"): {"*": 1e-5},
    # Against K and V as gguf rounds them; the CPU keeps q and the probabilities f32, the GPU reads
    # an f16 copy with the f16 kernels' rounding.
    ("attention", "q4_0"): {"*": 3e-3, "cpu": 1e-5},
    ("attention", "q4_1"): {"*": 3e-3, "cpu": 1e-5},
    ("attention", "q5_0"): {"*": 3e-3, "cpu": 1e-5},
    ("attention", "q5_1"): {"*": 3e-3, "cpu": 1e-5},
    ("attention", "iq4_nl"): {"*": 3e-3, "cpu": 1e-5},
    # bf16 K and V are exact as f32; the CPU keeps q and the probabilities f32, the GPU reads an f16
    # copy (exact for |x| in [2^-14, 65504]) with the f16 kernels' rounding.
    ("attention", "bf16"): {"*": 3e-3, "cpu": 1e-5},
    # Computed k and v as the cache rounds them, against the unrounded reference: up to 2^-11
    # relative per value for f16; half a step of its 32-group's amax / 127 for q8_0 (about 0.6% of
    # the norm).
    ("kv", "f16"): {"*": 1e-3},
    ("kv", "q8_0"): {"*": 1.5e-2},
    ("kv", "f32"): {"*": 0.0},
    ("kv", "bf16"): {"*": 4e-3},
    # 4 and 5 bits a value: half a step of a block's range over 15 (31) steps, about 8% (4%) of
    # the norm of normal rows.
    ("kv", "q4_0"): {"*": 0.12},
    ("kv", "q4_1"): {"*": 0.12},
    ("kv", "q5_0"): {"*": 0.06},
    ("kv", "q5_1"): {"*": 0.06},
    # 16 non-uniform levels with a least-squares scale: about q4_0's error
    ("kv", "iq4_nl"): {"*": 0.12},
}

# Backends whose every matmul kernel multiplies block-type weights by activations rounded to the
# type's vec_dot_type (_ember_test.vec_dot_type) exactly as ember's scalar quantizer does; they
# are also held to the ("matmul", "rounded") bound. (The GPU's kernels round to q8_1 or f16 by size.)
ROUNDS_ACTIVATIONS = {"cpu"}

# Kernel choices a backend makes through its switches (src/backend/switches.cpp): each op a switch
# reroutes runs again under that value. name: (switch overrides, ops it reroutes)
MATMUL_OPS = {"matmul", "matmul_many", "norm_matmul", "ffn", "attn_in", "attn_out", "moe"}
FUSED_OPS = {"matmul_many", "add_rmsnorm", "norm_matmul", "attn_in", "attn_out", "ffn", "moe", "moe_ffn"}
SIMD_OPS = {"matmul", "matmul_many", "attention", "gated_act", "kv_store", "moe", "short_conv", "ssm_scan"}
VARIANTS = {
    "cpu": {   # the SIMD levels below the CPU's best (EMBER_SIMD only lowers it)
        "avx2": ({"EMBER_SIMD": "avx2"}, SIMD_OPS),
        "scalar": ({"EMBER_SIMD": "scalar"}, SIMD_OPS),
    },
    "cuda": {
        "gemm_dq_off": ({"EMBER_CUDA_GEMM_DQ": "0"}, MATMUL_OPS),
        "gemm_q8_off": ({"EMBER_CUDA_GEMM_Q8": "0"}, MATMUL_OPS),
        "gemm_dq_mma_sync": ({"EMBER_CUDA_GEMM_DQ_WGMMA": "0"}, {"matmul", "matmul_many"}),
        "gemm_dq_rows_192": ({"EMBER_CUDA_GEMM_DQ_ROWS": "192"}, {"matmul", "matmul_many"}),
        "gemm_dq_rows_256": ({"EMBER_CUDA_GEMM_DQ_ROWS": "256"}, {"matmul", "matmul_many"}),
        "gemm_kq": ({"EMBER_CUDA_GEMM_KQ": "1"}, MATMUL_OPS),   # Q4_K, Q6_K batches of 9-64 tokens on gemm_dq
        "unfused": ({"EMBER_CUDA_FUSE": "0"}, FUSED_OPS),
        "flash_attention": ({"EMBER_CUDA_EXACT_ATTN": "0"}, {"attention", "attn_out"}),
        "exact_one_cta": ({"EMBER_CUDA_EXACT_CLUSTER": "0"}, {"attention"}),
        "short_attention": ({"EMBER_CUDA_SHORT_ATTN": "1"}, {"attention", "attn_out"}),
        "no_pdl": ({"EMBER_CUDA_PDL": "0"}, {"matmul", "attention"}),
    },
}

# The Backend members that are not ops of a forward pass, and where they are exercised.
NOT_OPS = {
    "name": "test_backends_come_from_the_registry",
    "is_host": "test_backends_come_from_the_registry",
    "alloc": "every op test: inputs and outputs live in the backend's memory",
    "free": "every op test",
    "copy_from_host": "every op test",
    "copy_to_host": "every op test",
    "synchronize": "every op test",
    "set_batch": "every op test sets the batch it runs under",
    "step_begin": "step graphs (whole forward steps): tests/test_cuda.py and the model tests",
    "step_end": "step graphs (whole forward steps): tests/test_cuda.py and the model tests",
    "step_abort": "the runner's unwinding of a step that throws between step_begin and step_end (CUDA graphs)",
    "host_parallel_for": "the CPU backend's pool, under every CPU op; streamed offload: tests/test_cuda.py",
    "open_stream": "streamed partial offload: tests/test_cuda.py::test_streamed_partial_offload",
    "free_memory": "the placement's GPU budget: tests/test_placement_moe.py",
}
# Each op of the contract and the test that checks it on every backend.
COVERAGE = {
    "matmul": "test_matmul", "matmul_many": "test_matmul_many", "rmsnorm": "test_rmsnorm",
    "head_rmsnorm": "test_head_rmsnorm", "rope": "test_rope", "attn_temperature": "test_attn_temperature",
    "rmsnorm_grouped": "test_rmsnorm_grouped", "kv_store": "test_kv_store",
    "attention": "test_attention", "gated_act": "test_gated_act", "add": "test_add", "add_bias": "test_add_bias",
    "argmax_rows": "test_argmax_rows", "add_rmsnorm": "test_add_rmsnorm", "norm_matmul": "test_norm_matmul",
    "attn_in": "test_attn_in", "attn_out": "test_attn_out", "ffn": "test_ffn", "prepare_weight": "test_matmul",
    "prepare_vector": "test_prepare_vector", "copy": "test_copy", "copy_to_host_async": "test_copy",
    "alloc_host": "test_copy", "free_host": "test_copy", "moe": "test_moe", "moe_ffn": "test_moe_ffn",
    "moe_route": "test_moe_route", "gather_rows": "test_gather_scatter_rows",
    "scatter_add_rows": "test_gather_scatter_rows", "sigmoid": "test_sigmoid", "mul": "test_mul",
    "softplus_gate": "test_softplus_gate", "copy_rows": "test_copy_rows",
    "scale_softcap": "test_scale_softcap",
    "layernorm": "test_layernorm", "unary": "test_unary", "encoder_attention": "test_encoder_attention",
    "gated_delta_rule": "test_gated_delta_rule", "short_conv": "test_short_conv",
    "ssm_scan": "test_ssm_scan",
}

BACKENDS = list(dict.fromkeys(["cpu", "cuda"] + list(K.backend_names())))


@functools.lru_cache(maxsize=None)
def make_backend(name, variant):
    """The backend (under the variant's switches), or the reason there is none on this machine."""
    if name not in K.backend_names():
        return f"this ember was built without the {name} backend (built in: {', '.join(K.backend_names())})"
    switches = VARIANTS[name][variant][0] if variant else {}
    level = switches.get("EMBER_SIMD")
    if level and level not in simd_levels_below(K.simd_level()):
        return f"this CPU's kernels run at {K.simd_level()}: EMBER_SIMD={level} is no lower level"
    try:
        return K.Backend(name, 2, switches=switches)
    except ValueError as e:
        if "EMBER_" in str(e):   # a switch the table refuses: VARIANTS is wrong, no reason to skip
            raise
        return f"the {name} backend cannot start here: {e}"


def simd_levels_below(top):
    x86 = ["scalar", "avx2", "avx512"]
    return ["scalar"] if top not in x86 else x86[:x86.index(top)]


def backends(op):
    """Parameters of every backend, and of each kernel variant that reroutes op."""
    out = []
    for name in BACKENDS:
        out.append(pytest.param((name, None), id=name))
        out += [pytest.param((name, v), id=f"{name}-{v}")
                for v, (_, ops) in VARIANTS.get(name, {}).items() if op in ops]
    return out


@pytest.fixture
def be(request):
    name, variant = request.param
    backend = make_backend(name, variant)
    if isinstance(backend, str):
        pytest.skip(backend)
    return backend


def on(op):
    return pytest.mark.parametrize("be", backends(op), indirect=True)


def tolerance(op, kind, backend):
    bounds = TOLERANCE[(op, kind)]
    return bounds.get(backend.name, bounds["*"])


def kind_of(t):
    return t.name if t in FLOAT_TYPES else "quant"


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check(got, want, bound, what):
    err = rel_err(got, want)
    assert err <= bound, f"{what}: relative error {err:.3g} over the bound {bound:g}"


def same_bits(got, want, what):
    got, want = np.ascontiguousarray(got, np.float32), np.ascontiguousarray(want, np.float32)
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, (f"{what}: {diff.size} of {got.size} values differ, first at {diff[0]}: "
                            f"{got.flat[diff[0]]!r} vs {want.flat[diff[0]]!r}")


def supports(backend, what, item):
    """Whether the backend takes item (a weight type or KV type name); its support row must exist."""
    assert backend.name in SUPPORT, f"backend '{backend.name}' has no row in SUPPORT: add the types it takes"
    return item in SUPPORT[backend.name][what]


def expect_unsupported(backend, what, run):
    """An unsupported combination fails with the backend's error naming what it lacks."""
    with pytest.raises(ValueError, match=UNSUPPORTED[backend.name][what]):
        run()


# ---- inputs ----

# Byte offsets of the fp16 scale (and min) fields of one block: random bytes there could be inf or NaN.
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82],
              T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
              T.MXFP4: [], T.IQ3_S: [0], T.IQ3_XXS: [0], T.IQ2_XXS: [0],
              T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ1_S: [0], T.IQ1_M: [], T.TQ1_0: [52], T.TQ2_0: [64], T.NVFP4: []}


def random_weight(t, n_out, n_in, rng, rms=None):
    """[n_out, row bytes] uint8. Float types: normal values. Block types: random quants (every bit
    pattern) with finite random scales. rms: the weights scaled to that root mean square (a
    product of several matrices needs realistic magnitudes; block types scale their fp16 fields,
    on which every value depends linearly)."""
    scale = 1.0 if rms is None else rms
    if t == T.F32:
        return (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return (rng.standard_normal((n_out, n_in)) * scale).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        f = (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    per_block, block_bytes = GGML_QUANT_SIZES[t]
    n_blocks = n_out * (n_in // per_block)
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    fields = [rng.uniform(0.002, 0.05, n_blocks) * rng.choice([-1, 1], n_blocks) for _ in F16_FIELDS[t]]

    def set_fields(factor):
        for off, d in zip(F16_FIELDS[t], fields):
            blocks[:, off:off + 2] = (d * factor).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if t == T.MXFP4:   # e8m0 exponents instead of f16 scales: values up to 6 * 2^(e - 127)
        e = rng.integers(118, 124, n_blocks)
        blocks[:, 0] = e
        if rms is not None:
            now = np.sqrt(np.mean(dequant(t, blocks.reshape(n_out, -1), n_in) ** 2))
            blocks[:, 0] = e + int(np.round(np.log2(rms / now)))
        return blocks.reshape(n_out, -1)
    if t == T.NVFP4:   # e4m3 scales, exponent field 1-3: values up to 6 * 2^(e - 7)
        e, m = rng.integers(1, 4, (n_blocks, 4)), rng.integers(0, 8, (n_blocks, 4))
        blocks[:, 0:4] = e << 3 | m
        if rms is not None:
            now = np.sqrt(np.mean(dequant(t, blocks.reshape(n_out, -1), n_in) ** 2))
            blocks[:, 0:4] = np.clip(e + int(np.round(np.log2(rms / now))), 1, 14) << 3 | m
        return blocks.reshape(n_out, -1)
    if t == T.IQ1_M:   # its fp16 d in the top nibbles of the 4 scale words (bytes 48-55)
        d = rng.uniform(0.002, 0.05, n_blocks) * rng.choice([-1, 1], n_blocks)

        def set_fields(factor):
            bits = (d * factor).astype(np.float16).view(np.uint16)
            for w in range(4):
                blocks[:, 49 + 2 * w] = (blocks[:, 49 + 2 * w] & 0x0F) | (((bits >> (4 * w)) & 0x0F) << 4)
    set_fields(1.0)
    if rms is not None:
        now = np.sqrt(np.mean(dequant(t, blocks.reshape(n_out, -1), n_in) ** 2))
        set_fields(rms / now)
    return blocks.reshape(n_out, -1)


def dequant(t, w, n_in):
    """float64 [n_out, n_in] of a weight as gguf's dequantizers read it."""
    if t == T.F32:
        return w.view(np.float32).reshape(w.shape[0], n_in).astype(np.float64)
    return gguf.quants.dequantize(w, t).reshape(w.shape[0], n_in).astype(np.float64)


def rounded_activations(t, x):
    """float64 x rounded to t's vec_dot_type and back by ember's scalar quantizer and dequantizer."""
    vt = K.vec_dot_type(int(t))
    return np.stack([K.dequantize(vt, K.quantize(vt, row), row.size) for row in x]).astype(np.float64)


def row_width(t, n_in_32, n_in_256):
    return n_in_256 if GGML_QUANT_SIZES[t][0] >= 64 else n_in_32


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- the contract ----

def contract_members():
    """The virtual members of class Backend in backend.h."""
    text = (ROOT / "src" / "backend" / "backend.h").read_text()
    body = text[text.index("class Backend {"):]
    body = body[:body.index("\n};")]
    return set(re.findall(r"virtual\s+[^;{(]*?\b(\w+)\s*\(", body)) - {"Backend"}


def test_every_contract_op_is_covered():
    """A member joining the Backend contract fails here until the binding runs it (contract_ops)
    and a test of this suite checks it on every backend (COVERAGE), or NOT_OPS says why it is no op."""
    members, bound = contract_members(), dict(K.contract_ops())
    assert "matmul" in members and "ffn" in members, "backend.h's Backend members were not found"
    assert not set(COVERAGE) & set(NOT_OPS)
    assert members == set(COVERAGE) | set(NOT_OPS), (
        f"not in the suite: {sorted(members - set(COVERAGE) - set(NOT_OPS))}; "
        f"no longer in the contract: {sorted((set(COVERAGE) | set(NOT_OPS)) - members)}")
    assert set(bound) == set(COVERAGE), f"binding vs suite: {sorted(set(bound) ^ set(COVERAGE))}"
    for op, method in bound.items():
        assert hasattr(K.Backend, method), f"{op}: _ember_test.Backend has no {method}"
    for op, test in COVERAGE.items():
        assert callable(globals().get(test)), f"{op}: no {test} in this suite"


def test_every_type_is_covered():
    """A type joining the quant tables fails here until the suite runs it on every backend and each
    backend's SUPPORT row says whether it takes it."""
    known, ours = {name for name, _ in K.known_types()}, {t.name for t in WEIGHT_TYPES} | ACTIVATION_TYPES
    assert known == ours, (f"in the quant tables, not in the suite: {sorted(known - ours)} (add each to WEIGHT_TYPES "
                           f"and the SUPPORT rows, or ACTIVATION_TYPES); gone: {sorted(ours - known)}")
    for name in sorted(set(SUPPORT) | set(K.backend_names())):
        assert name in SUPPORT, f"backend '{name}' has no row in SUPPORT"
        assert set(SUPPORT[name]["weights"]) <= set(WEIGHT_TYPES) and set(SUPPORT[name]["kv"]) <= set(KV_TYPES)
        if set(SUPPORT[name]["weights"]) != set(WEIGHT_TYPES) or set(SUPPORT[name]["kv"]) != set(KV_TYPES):
            assert name in UNSUPPORTED, f"backend '{name}' lacks types but UNSUPPORTED has no error for them"


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_reference_dequantizers_agree(t, rng):
    """The references agree: ember's scalar dequantizer gives gguf's values bit for bit."""
    n_in = GGML_QUANT_SIZES[t][0] * 8 if t not in FLOAT_TYPES else 256
    w = random_weight(t, 3, n_in, rng)
    ours = np.stack([K.dequantize(int(t), row, n_in) for row in w])
    same_bits(ours, dequant(t, w, n_in).astype(np.float32), t.name)


@pytest.mark.parametrize("name", BACKENDS)
def test_backends_come_from_the_registry(name):
    backend = make_backend(name, None)
    if isinstance(backend, str):
        pytest.skip(backend)
    assert backend.name == name
    assert backend.is_host == SUPPORT[name]["host"]


def test_variants_are_switches():
    """Every kernel variant names switches of the table (src/backend/switches.cpp) with values they
    take, whether or not its backend is on this machine."""
    from ember.switches import table
    rows = {row["name"]: row["values"] for row in table()}
    for backend, variants in VARIANTS.items():
        for variant, (switches, ops) in variants.items():
            assert ops <= set(COVERAGE), f"{backend}-{variant}: {sorted(ops - set(COVERAGE))} are no ops"
            for name, value in switches.items():
                assert name in rows, f"{backend}-{variant}: no switch {name}"
                assert rows[name] == "integer" and value.isdigit() or value in rows[name].split("|"), (
                    f"{backend}-{variant}: {name} takes {rows[name]}, not {value}")


# ---- matmul ----

# name: (n_tok, sequences (None: one), n_out, n_in for 32-element blocks and float types, n_in for
# 256-element super-blocks)
MATMUL_SHAPES = {
    "one": (1, None, 256, 512, 512),         # a decode step
    "few": (3, None, 256, 512, 512),
    "eight": (8, None, 256, 512, 512),       # the GPU's GEMV takes up to 8
    "steps": (8, 8, 256, 512, 512),          # an engine step: 8 sequences, a token each
    "prompt": (80, None, 256, 512, 512),
    "ragged": (37, None, 203, 544, 768),     # 17 blocks / 3 super-blocks, 203 rows: no tile divides them
    "wide_decode": (2, None, 64, 4096, 4096),   # several units a GPU lane
    "wide": (40, None, 300, 4096, 4096),     # rows the GPU's GEMM kernels take
    "long_rows": (2, None, 64, 11008, 11264),   # a ragged last stride of the GEMV
}


@on("matmul")
@pytest.mark.parametrize("shape", list(MATMUL_SHAPES))
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul(be, t, shape, rng):
    n_tok, n_seq, n_out, n_in_32, n_in_256 = MATMUL_SHAPES[shape]
    n_in = row_width(t, n_in_32, n_in_256)
    w = random_weight(t, n_out, n_in, rng)
    x = normal(rng, n_tok, n_in)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", lambda: be.matmul(int(t), w, n_in, x))
    y = be.matmul(int(t), w, n_in, x, n_seq=n_seq)
    assert y.shape == (n_tok, n_out)
    wd = dequant(t, w, n_in)
    check(y, x.astype(np.float64) @ wd.T, tolerance("matmul", kind_of(t), be), f"{t.name} {shape}")
    if be.name in ROUNDS_ACTIVATIONS and t not in FLOAT_TYPES:
        check(y, rounded_activations(t, x) @ wd.T, tolerance("matmul", "rounded", be), f"{t.name} {shape}, rounded x")


@on("matmul")
@pytest.mark.parametrize("t", [T.F16, T.Q4_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_matmul_batch_invariant(be, t, rng):
    """Under BatchInfo::batch_invariant a token's row has the same bits in a batch of 200, of 16
    and of 1, whatever kernels the sizes would otherwise take."""
    n_out, n_in = 96, 4096
    w, x = random_weight(t, n_out, n_in, rng), normal(rng, 200, n_in)
    y200 = be.matmul(int(t), w, n_in, x, n_seq=200, batch_invariant=True)
    same_bits(y200[:16], be.matmul(int(t), w, n_in, x[:16], n_seq=16, batch_invariant=True), "16 of 200")
    same_bits(y200[:1], be.matmul(int(t), w, n_in, x[:1], n_seq=1, batch_invariant=True), "1 of 200")


@on("matmul_many")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", ["one", "steps", "prompt", "wide"])
def test_matmul_many(be, shape, composed, rng):
    """Weights of several types reading one input (Q, K, V; gate, up), each output its own product."""
    n_tok, n_seq, _, _, n_in = MATMUL_SHAPES[shape]
    types = [t for t in (T.Q4_0, T.Q4_0, T.Q8_0, T.F16, T.Q4_K, T.Q6_K, T.Q5_1) if supports(be, "weights", t)]
    ws = [random_weight(t, int(n), n_in, rng) for t, n in zip(types, rng.integers(40, 300, len(types)))]
    x = normal(rng, n_tok, n_in)
    ys = be.matmul_many([int(t) for t in types], ws, n_in, x, n_seq=n_seq, composed=composed)
    for t, w, y in zip(types, ws, ys):
        wd = dequant(t, w, n_in)
        check(y, x.astype(np.float64) @ wd.T, tolerance("matmul", kind_of(t), be), t.name)
        if be.name in ROUNDS_ACTIVATIONS and t not in FLOAT_TYPES:
            check(y, rounded_activations(t, x) @ wd.T, tolerance("matmul", "rounded", be), f"{t.name}, rounded x")


@on("norm_matmul")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("n_tok", [1, 5])
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_norm_matmul(be, t, n_tok, composed, rng):
    """The output head: x += residual, the normed rows, their product with W."""
    n_in, n_out = 512, 203
    w = random_weight(t, n_out, n_in, rng)
    x, res = normal(rng, n_tok, n_in), (normal(rng, n_tok, n_in) if n_tok > 1 else None)
    gamma = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    run = lambda: be.norm_matmul(int(t), w, x, res, gamma, 1e-5, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    y, xn, x_sum = run()
    want_x = x if res is None else x + res
    same_bits(x_sum, want_x, "x after the residual add")
    want_xn = ref.rmsnorm(want_x, gamma, 1e-5)
    check(xn, want_xn, tolerance("rmsnorm", None, be), "normed rows")
    check(y, want_xn @ dequant(t, w, n_in).T, tolerance("matmul", kind_of(t), be) + 1e-5, "product")


# ---- norms, rope, elementwise ----

NORM_SHAPES = {"one": (1, 576), "few": (5, 4096), "prompt": (70, 2048), "ragged": (37, 1001)}


@on("rmsnorm")
@pytest.mark.parametrize("shape", list(NORM_SHAPES))
def test_rmsnorm(be, shape, rng):
    n_tok, dim = NORM_SHAPES[shape]
    x = normal(rng, n_tok, dim) * rng.uniform(0.1, 5, (n_tok, 1)).astype(np.float32)
    g = normal(rng, dim)
    check(be.rmsnorm(x, g, 1e-5), ref.rmsnorm(x, g, 1e-5), tolerance("rmsnorm", None, be), shape)


@on("add_rmsnorm")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("residual", [False, True], ids=["no_residual", "residual"])
@pytest.mark.parametrize("shape", list(NORM_SHAPES))
def test_add_rmsnorm(be, shape, residual, composed, rng):
    n_tok, dim = NORM_SHAPES[shape]
    x, g = normal(rng, n_tok, dim, scale=3), normal(rng, dim)
    res = normal(rng, n_tok, dim) if residual else None
    y, x_sum = be.add_rmsnorm(x, res, g, 1e-6, composed=composed)
    want_x = x + res if residual else x
    same_bits(x_sum, want_x, "x after the residual add")
    check(y, ref.rmsnorm(want_x, g, 1e-6), tolerance("rmsnorm", None, be), shape)


@on("head_rmsnorm")
@pytest.mark.parametrize("n_tok,n_heads,head_dim", [(1, 8, 128), (5, 6, 64), (37, 3, 80), (70, 2, 256)])
def test_head_rmsnorm(be, n_tok, n_heads, head_dim, rng):
    x = normal(rng, n_tok, n_heads * head_dim) * rng.uniform(0.1, 5, (n_tok, n_heads * head_dim)).astype(np.float32)
    g = normal(rng, head_dim)
    got = be.head_rmsnorm(x, g, n_heads, head_dim, 1e-6)
    check(got, ref.head_rmsnorm(x, g, n_heads, head_dim, 1e-6), tolerance("rmsnorm", None, be), "head_rmsnorm")


# ---- Mamba2's grouped norm ----

@on("rmsnorm_grouped")
@pytest.mark.parametrize("n_rows,width,n_groups", [(1, 64, 1), (5, 256, 4), (37, 3 * 80, 3), (70, 2 * 1024, 2),
                                                   (9, 8 * 33, 8)])
def test_rmsnorm_grouped(be, n_rows, width, n_groups, rng):
    """Each group of a row normed apart (a row of a few large groups beside small ones: one norm
    per row would be far off), each group by its own part of gamma."""
    scale = rng.uniform(0.1, 5, (n_rows, n_groups, 1)).astype(np.float32)
    x = (normal(rng, n_rows, n_groups, width // n_groups) * scale).reshape(n_rows, width)
    g = normal(rng, width)
    got = be.rmsnorm_grouped(x, g, n_groups, 1e-5)
    check(got, ref.rmsnorm_grouped(x, g, n_groups, 1e-5), tolerance("rmsnorm", None, be), "rmsnorm_grouped")


@on("rmsnorm_grouped")
def test_rmsnorm_grouped_bad_input(be):
    for width, n_groups in ((10, 3), (12, 0), (12, -2)):
        with pytest.raises(ValueError, match=f"width {width} must be a positive multiple of n_groups {n_groups}"):
            be.rmsnorm_grouped(np.ones((2, width), np.float32), np.ones(width, np.float32), n_groups, 1e-5)


# name: (n_tok, n_heads, head_dim)
ROPE_SHAPES = {"one": (1, 4, 64), "few": (7, 6, 128), "prompt": (64, 2, 64), "ragged": (37, 3, 80)}


@on("rope")
@pytest.mark.parametrize("scaling", ["none", "freq_factors", "linear", "yarn"])
@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("shape", list(ROPE_SHAPES))
def test_rope(be, shape, neox, scaling, rng):
    n_tok, n_heads, hd = ROPE_SHAPES[shape]
    pos = [int(p) for p in rng.integers(0, 8000, n_tok)]
    x = normal(rng, n_tok, n_heads * hd)
    params = {} if scaling == "none" else ref.rope_scalings(hd, rng)[scaling]
    base = float(rng.choice([10000.0, 500000.0]))
    got = be.rope(x, pos, n_heads, hd, base, neox, **params)
    check(got, ref.rope(x, pos, n_heads, hd, base, neox, **params), tolerance("rope", None, be), f"{shape} {scaling}")


@on("gated_act")
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "swiglu_clamped"])
@pytest.mark.parametrize("n", [33, 10007, 40000])
def test_gated_act(be, act, n, rng):
    """Normal values, and (n 40000) the range where exp overflows and underflows."""
    g = normal(rng, n, scale=4) if n != 40000 else rng.uniform(-120, 120, n).astype(np.float32)
    u = normal(rng, n)
    # Measured against |g u|, the size of the op's inputs: gelu's 1 + tanh cancels for negative g,
    # so a few elements' outputs are far smaller than the rounding of that sum (one element alone
    # made the output-relative error 4.5e-5 on one seed).
    got = np.asarray(be.gated_act(g, u, act), np.float64)
    want = np.asarray(ref.gated_act(g, u, act), np.float64)
    assert np.all(np.isfinite(got)), "non-finite output"
    err = float(np.linalg.norm(got - want) / np.linalg.norm(np.asarray(g, np.float64) * u))
    assert err <= tolerance("gated_act", None, be), f"{act}: error {err:.3g} relative to |g u|"


@on("add")
@pytest.mark.parametrize("n", [1, 1000, 100003])
def test_add(be, n, rng):
    x, y = normal(rng, n, scale=3), normal(rng, n)
    same_bits(be.add(x, y), x + y, "add")


# name: (n_tok, n_heads, head_dim, rotated dimensions): Phi-3 mini (96 of 96), Phi-3-like partial
# (a quarter), GLM-4's half head, and an odd number of rotated pairs.
PARTIAL_ROPE_SHAPES = {"phi_quarter": (5, 3, 96, 24), "glm_half": (37, 2, 128, 64), "odd_pairs": (1, 4, 80, 18),
                       "whole": (9, 2, 64, 64)}


@on("rope")
@pytest.mark.parametrize("scaling", ["none", "freq_factors", "yarn"])
@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("shape", list(PARTIAL_ROPE_SHAPES))
def test_rope_partial(be, shape, neox, scaling, rng):
    """Partial rotary: each head's first n_rot dimensions rotate as a head of n_rot (its pairs, its
    frequencies, frequency factors [n_rot / 2]); the rest come back with the same bits."""
    n_tok, n_heads, hd, n_rot = PARTIAL_ROPE_SHAPES[shape]
    pos = [int(p) for p in rng.integers(0, 8000, n_tok)]
    x = normal(rng, n_tok, n_heads * hd)
    params = {} if scaling == "none" else ref.rope_scalings(n_rot, rng)[scaling]
    got = be.rope(x, pos, n_heads, hd, 10000.0, neox, n_rot=n_rot, **params)
    check(got, ref.rope(x, pos, n_heads, hd, 10000.0, neox, n_rot=n_rot, **params), tolerance("rope", None, be),
          f"{shape} {scaling}")
    passed = np.arange(n_heads * hd) % hd >= n_rot
    same_bits(got[:, passed], x[:, passed], "the dimensions past n_rot")


@on("rope")
def test_rope_partial_bad_input(be):
    x = np.ones((1, 64), np.float32)
    for n_rot in (-2, 3, 66):
        with pytest.raises(ValueError, match="n_rot must be even and between 0"):
            be.rope(x, [0], 1, 64, 10000.0, False, n_rot=n_rot)
    with pytest.raises(ValueError, match="freq_factors must be \\[rotated dims / 2 = 8\\]"):
        be.rope(x, [0], 1, 64, 10000.0, False, n_rot=16, freq_factors=np.ones(32, np.float32))


@on("attn_temperature")
@pytest.mark.parametrize("offset", [0, 1], ids=["mistral3", "llama4"])
@pytest.mark.parametrize("n_tok", [1, 7, 300])
def test_attn_temperature(be, n_tok, offset, rng):
    """Llama 4's and Mistral 3's attention temperature: each query row times 1 + beta * ln(1 +
    floor((pos + offset) / length)); positions below the length keep their bits, and with llama 4's
    offset of 1 the last position of each period already takes the next factor."""
    length = int(rng.integers(16, 2000))
    pos = [int(p) for p in rng.integers(0, 50 * length, n_tok)]
    pos[0] = int(rng.integers(0, length - 1))
    pos[-1] = length - 1 if n_tok > 1 else pos[-1]
    q = normal(rng, n_tok, 96)
    beta = float(rng.uniform(0.05, 0.5))
    got = be.attn_temperature(q, pos, beta, length, temp_offset=offset)
    check(got, ref.attn_temperature(q, pos, beta, length, offset), 1e-6, f"temperature over {length}")
    same_bits(got[0], q[0], "a position below the length")
    if n_tok > 1:
        assert (got[-1] == q[-1]).all() == (offset == 0), "position length - 1 is scaled exactly when counted from 1"


@on("attn_temperature")
def test_attn_temperature_bad_input(be):
    with pytest.raises(ValueError, match="temp_length must be positive, got 0"):
        be.attn_temperature(np.ones((1, 8), np.float32), [3], 0.1, 0)
    with pytest.raises(ValueError, match="q must be \\[len\\(pos\\), width\\]"):
        be.attn_temperature(np.ones((2, 8), np.float32), [3], 0.1, 16)



@on("add_bias")
@pytest.mark.parametrize("n_tok,dim", [(1, 64), (5, 1001), (70, 2048)])
def test_add_bias(be, n_tok, dim, rng):
    x, bias = normal(rng, n_tok, dim), normal(rng, dim)
    same_bits(be.add_bias(x, bias), x + bias, "add_bias")


@on("argmax_rows")
@pytest.mark.parametrize("width", [16, 257, 1000, 1001, 32000, 49152, 151936])   # 1001: the GPU's scalar loads
def test_argmax_rows(be, width, rng):
    x = ref.argmax_cases(rng, width)
    assert be.argmax_rows(x) == ref.greedy_ids(x)


@on("prepare_vector")
@pytest.mark.parametrize("t", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 576, 4099])
def test_prepare_vector(be, t, n, rng):
    """Norm weights and biases of a float type come back as exactly their f32 values."""
    w = random_weight(t, 1, n, rng).ravel()
    same_bits(be.prepare_vector(int(t), w, n), dequant(t, w.reshape(1, -1), n).ravel(), t.name)


@on("copy")
@pytest.mark.parametrize("n", [1, 4096, 1 << 20])
def test_copy(be, n, rng):
    """Backend::copy of a byte range to another offset (a KV block's copy on write), read back
    through copy_to_host_async into alloc_host memory: those bytes moved, none other touched."""
    data = rng.integers(0, 256, n, dtype=np.uint8)
    src, dst = int(rng.integers(0, n)), int(rng.integers(0, n))
    count = int(rng.integers(0, n - max(src, dst) + 1))
    fill = int(rng.integers(0, 256))
    got = be.copy(data, src, dst, count, fill)
    want = np.full(n, fill, np.uint8)
    want[dst:dst + count] = data[src:src + count]
    assert np.array_equal(got, want)


# ---- KV cache and attention ----

def kv_rounded(x, kv_type):
    """Rows as a cache of kv_type holds them: f16 to nearest even, block types through ember's
    scalar quantizers (ggml's quantize_row_*)."""
    if kv_type not in BLOCK_KV_TYPES:
        return ref.kv_round(x, kv_type)
    t = int(T[kv_type.upper()])
    return np.stack([K.dequantize(t, K.quantize(t, np.ascontiguousarray(r)), r.size) for r in x])


def assert_kv_rows(got, want, kv_type, what):
    """f32 and f16 rows exact; q8_0 rows exact but for the rare value at a rounding tie, which
    x / d and x * (1 / d) may send to neighbouring steps."""
    if kv_type != "q8_0":
        return same_bits(got, want, what)
    step = np.repeat(np.abs(want).reshape(-1, 32).max(axis=1) / 127, 32).reshape(want.shape)
    off = np.abs(got - want)
    assert np.all(off <= step * 1.001 + 1e-30), f"{what}: a value off by more than one q8_0 step"
    assert np.count_nonzero(off) <= max(1, want.size // 1000), f"{what}: {np.count_nonzero(off)} values off"


# name: (sequences, positions each, tokens stored, n_head_kv, head_dim, block_size)
KV_STORE_SHAPES = {
    "one": (1, 40, 1, 2, 64, 16),
    "steps": (4, 50, 4, 2, 128, 16),      # an engine step: several sequences
    "prompt": (1, 100, 70, 4, 64, 16),
    "ragged": (3, 45, 20, 3, 96, 5),      # blocks of 5 positions, heads of three 32-groups
}


@on("kv_store")
@pytest.mark.parametrize("type_v", KV_TYPES)
@pytest.mark.parametrize("type_k", KV_TYPES)
@pytest.mark.parametrize("shape", list(KV_STORE_SHAPES))
def test_kv_store(be, shape, type_k, type_v, rng):
    """Each token's k and v land at its (sequence, position) of a shuffled block table, rounded as
    the cache type holds them; every other position keeps its NaN bytes."""
    n_seq, length, n_tok, n_kv, hd, bs = KV_STORE_SHAPES[shape]
    slots = rng.choice(n_seq * length, n_tok, replace=False)
    seq, pos = [int(s) for s in slots // length], [int(p) for p in slots % length]
    k, v = normal(rng, n_tok, n_kv * hd, scale=2), normal(rng, n_tok, n_kv * hd)
    run = lambda: be.kv_store(k, v, pos, seq, n_seq, length, n_kv, hd, bs, seed=int(rng.integers(1 << 30)),
                              type_k=type_k, type_v=type_v)
    if not (supports(be, "kv", type_k) and supports(be, "kv", type_v)):
        return expect_unsupported(be, "kv", run)
    k_cache, v_cache = run()
    for name, cache, rows, kv_type in (("K", k_cache, k, type_k), ("V", v_cache, v, type_v)):
        stored = np.zeros((n_seq, length), bool)
        stored[seq, pos] = True
        assert np.all(np.isnan(cache[~stored])), f"{name}: a position no token was stored at changed"
        assert_kv_rows(cache[seq, pos], kv_rounded(rows, kv_type), kv_type, f"{name} ({kv_type})")


# name: (n_head, n_head_kv, head_dim, kv length, query positions, block_size, window, each query
# its own sequence over the same blocks: an engine decode step in its default mode)
ATTENTION_SHAPES = {
    "first_token": (8, 8, 128, 1, [0], 16, 0, False),
    "decode": (8, 8, 128, 77, [76], 16, 0, False),
    "decode_gqa_9_3": (9, 3, 64, 200, [199], 16, 0, False),
    "decode_batch": (4, 2, 128, 64, [10, 63, 40], 16, 0, False),
    "steps": (4, 2, 128, 300, [10, 299, 63, 128], 16, 0, True),
    "prompt": (4, 4, 128, 100, list(range(100)), 16, 0, False),
    "prompt_gqa": (9, 3, 64, 70, list(range(20, 70)), 32, 0, False),
    "block_5": (6, 2, 64, 75, [0, 1, 17, 40, 74], 5, 0, False),       # blocks not a power of two
    "block_8": (8, 4, 128, 200, [199, 7, 8], 8, 0, False),
    "block_12": (4, 2, 64, 100, [99, 50], 12, 0, False),
    "window_decode": (8, 2, 64, 96, [90], 16, 27, False),
    "window_prompt": (8, 2, 64, 96, [0, 5, 31, 32, 60, 95], 16, 40, False),
    "window_steps": (8, 2, 64, 300, [299, 100, 20], 16, 40, True),
    "head_dim_32": (4, 4, 32, 33, [3, 32], 8, 0, False),
    "head_dim_80": (4, 2, 80, 90, [89, 3], 16, 0, False),            # no whole 32-groups: no q8_0
    "head_dim_96": (4, 2, 96, 90, [89, 3], 16, 0, False),
    "head_dim_256": (2, 1, 256, 130, [129, 64], 16, 0, False),
    "head_dim_256_prompt": (2, 1, 256, 40, list(range(40)), 16, 0, False),
    "short_and_long": (4, 2, 128, 701, [10, 700, 300], 16, 0, True),   # contexts either side of 512
    "long_decode": (8, 2, 128, 1100, [1099], 16, 0, False),            # GPU: split over the keys
    "long_prompt": (8, 2, 128, 1100, list(range(1000, 1100)), 16, 0, False),
    "prompt_long_gqa": (8, 2, 128, 700, list(range(300, 700)), 16, 0, False),
    "long_split": (8, 8, 128, 3000, [2999], 16, 0, False),
    "long_split_gqa": (32, 8, 128, 2500, [1000, 2499], 64, 0, False),
    "long_split_gqa_9_3": (9, 3, 64, 1200, [1199, 800], 16, 0, False),
    "long_gqa_17": (34, 2, 64, 900, [899], 16, 0, False),              # 17 q heads a kv head
    "long_split_hd256": (4, 2, 256, 1500, [1499], 16, 0, False),
    "long_split_block_8": (8, 4, 128, 1500, [1499, 700], 8, 0, False),
    # Heads of 512 (Gemma 4's global layers: 8 q heads a kv head in the 31B): the GPU's tiled kernel in
    # its wide form at every length, at most 4 q heads x tokens a CTA.
    "hd512_decode": (8, 1, 512, 150, [149], 16, 0, False),
    "hd512_decode_batch": (4, 2, 512, 64, [10, 63, 40], 16, 0, False),
    "hd512_steps": (8, 2, 512, 700, [699, 100, 300], 16, 0, True),
    "hd512_prompt": (4, 4, 512, 100, list(range(100)), 16, 0, False),
    "hd512_prompt_gqa_3": (6, 2, 512, 90, list(range(20, 90)), 16, 0, False),   # a CTA slot of 4 left empty
    "hd512_window_decode": (8, 2, 512, 600, [599], 16, 40, False),
    "hd512_window_prompt": (8, 2, 512, 300, list(range(100, 300)), 16, 64, False),
    "hd512_long_split": (8, 1, 512, 1500, [1499], 16, 0, False),
    "hd512_block_5": (4, 1, 512, 75, [74, 17, 0], 5, 0, False),
}
# K and V types: the same type for every shape, each mix on a few.
KV_PAIRS = [(t, t) for t in KV_TYPES]
MIXED_KV_PAIRS = ([(k, v) for k in ("f16", "q8_0", "f32", "bf16") for v in ("f16", "q8_0", "f32", "bf16") if k != v]
                  + [("q4_0", "f16"), ("f16", "q5_1"), ("q4_1", "q8_0"), ("q5_0", "bf16")])
MIXED_KV_SHAPES = ["decode_gqa_9_3", "steps", "prompt_gqa", "window_prompt", "long_decode", "long_prompt",
                   "hd512_steps"]


def attention_bound(backend, type_k, type_v):
    return max(tolerance("attention", t, backend) for t in (type_k, type_v))


@on("attention")
@pytest.mark.parametrize("shape,type_k,type_v", [(s, k, v) for s in ATTENTION_SHAPES for k, v in KV_PAIRS]
                         + [(s, k, v) for s in MIXED_KV_SHAPES for k, v in MIXED_KV_PAIRS])
def test_attention(be, shape, type_k, type_v, rng):
    """Causal attention over a paged cache (shuffled blocks, GQA, windows): the float64 softmax over
    K and V as their caches hold them."""
    n_head, n_kv, hd, length, pos, bs, window, steps = ATTENTION_SHAPES[shape]
    q, k, v = normal(rng, len(pos), n_head * hd), normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    run = lambda: be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)), type_k=type_k,
                               type_v=type_v, window=window, fast=steps)
    if hd % 32 and BLOCK_KV_TYPES & {type_k, type_v}:
        with pytest.raises(ValueError, match="KV cache needs head_dim to be a multiple of 32"):
            run()
        return
    if not (supports(be, "kv", type_k) and supports(be, "kv", type_v)):
        return expect_unsupported(be, "kv", run)
    if be.name == "cuda" and type_k == type_v == "q8_0" and (bs * n_kv * hd) % 256:
        # The tensor-core kernels read a q8_0 cache through an f16 copy made in 256-value units.
        with pytest.raises(ValueError, match="is not a multiple of 256"):
            run()
        return
    want = ref.attention(q, ref.kv_round(k, type_k), ref.kv_round(v, type_v), pos, n_head, n_kv, hd, window)
    got = run()
    check(got, want, attention_bound(be, type_k, type_v), f"{shape} K {type_k} V {type_v}")
    if type_k != type_v:   # each cache's type takes effect: neither single-type cache gives this
        for same in (type_k, type_v):
            alone = be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=1, kv_type=same, window=window, fast=steps)
            assert not np.array_equal(got, alone), f"K {type_k} V {type_v} gives the {same} cache's result"


@on("attention")
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
@pytest.mark.parametrize("shape", ["decode_batch", "steps", "short_and_long", "prompt_gqa", "window_prompt",
                                   "long_prompt", "hd512_prompt", "hd512_steps"])
def test_attention_batch_invariant(be, shape, kv_type, rng):
    """Under BatchInfo::batch_invariant (the engine's deterministic mode) each query's output has
    the same bits alone as in its batch, whatever kernels the batch would otherwise take."""
    n_head, n_kv, hd, length, pos, bs, window, steps = ATTENTION_SHAPES[shape]
    if be.name == "cuda" and shape == "short_and_long":
        pytest.xfail("CUDA picks the attention kernel from the batch's longest context (the reference-order kernel "
                     "up to 512 positions, the tiled one past them), so a query's bits depend on whether a longer "
                     "one shares its batch: a known gap of deterministic mode, docs/engine.md")
    q, k, v = normal(rng, len(pos), n_head * hd), normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    run = lambda rows: be.attention(q[rows], k, v, [pos[i] for i in rows], n_head, n_kv, hd, bs, seed=3,
                                    kv_type=kv_type, window=window, fast=steps, batch_invariant=True)
    every = run(list(range(len(pos))))
    for i in sorted({0, len(pos) // 2, len(pos) - 1}):
        same_bits(every[i], run([i])[0], f"query {i} of {len(pos)}")


# Shapes for attention with sinks (gpt-oss: 64-dim heads, 8 q heads a kv head, a window of 128 on
# every other layer), with the shapes that reach each kernel: short and long contexts, decode
# batches, engine steps, prompts on tensor cores, key ranges split over CTAs.
SINK_SHAPES = {
    "gpt_oss_decode": (16, 2, 64, 600, [599], 16, 0, False),
    "gpt_oss_window_decode": (16, 2, 64, 1100, [1099], 16, 128, False),
    "gpt_oss_window_prompt": (16, 2, 64, 400, list(range(200, 400)), 16, 128, False),
    "gpt_oss_window_steps": (16, 2, 64, 700, [699, 100, 300], 16, 128, True),
    **{name: ATTENTION_SHAPES[name] for name in [
        "first_token", "decode_gqa_9_3", "decode_batch", "steps", "prompt_gqa", "window_decode", "window_prompt",
        "head_dim_256_prompt", "short_and_long", "long_decode", "long_prompt", "long_split_gqa",
        "long_split_hd256", "hd512_steps", "hd512_window_prompt"]},
}


def random_sinks(rng, n_head, n_keys):
    """Sink logits that take from a few to most percent of a softmax over n_keys scores of about
    N(0, 1), one far above them (the sink takes nearly all the mass) and one far below (nearly none)."""
    sinks = (np.log(n_keys) + rng.uniform(-3.0, 3.0, n_head)).astype(np.float32)
    sinks[0], sinks[-1] = np.log(n_keys) + 12.0, -30.0
    return rng.permutation(sinks)


@on("attention")
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "batch_invariant"])
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("shape", list(SINK_SHAPES))
def test_attention_sinks(be, shape, kv_type, batch_invariant, rng):
    """Per-head sink logits (AttentionShape::sinks): one more logit in each head's softmax that adds
    no value, as gpt-oss (and llama.cpp's soft_max sinks) define it; with windows and GQA, on every
    kernel."""
    n_head, n_kv, hd, length, pos, bs, window, steps = SINK_SHAPES[shape]
    q, k, v = normal(rng, len(pos), n_head * hd), normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    sinks = random_sinks(rng, n_head, min(length, window or length))
    run = lambda s: be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)),
                                 kv_type=kv_type, window=window, fast=steps, batch_invariant=batch_invariant,
                                 sinks=s)
    if not supports(be, "kv", kv_type):
        return expect_unsupported(be, "kv", lambda: run(sinks))
    if be.name == "cuda" and kv_type == "q8_0" and (bs * n_kv * hd) % 256:
        with pytest.raises(ValueError, match="is not a multiple of 256"):
            run(sinks)
        return
    want = ref.attention(q, ref.kv_round(k, kv_type), ref.kv_round(v, kv_type), pos, n_head, n_kv, hd, window, sinks)
    got = run(sinks)
    bound = tolerance("attention", kv_type, be)
    check(got, want, bound, f"{shape} {kv_type}")
    plain = ref.attention(q, ref.kv_round(k, kv_type), ref.kv_round(v, kv_type), pos, n_head, n_kv, hd, window)
    assert rel_err(got, plain) > 5 * bound, "the sinks change the output by less than the bound: the test sees nothing"


@on("attention")
def test_attention_sinks_bad_input(be):
    q, kv = np.ones((2, 64), np.float32), np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="sinks must be \\[2\\] float32, got 3 values"):
        be.attention(q, kv, kv, [0, 1], 2, 1, 32, 16, sinks=np.ones(3, np.float32))


# Shapes for soft-capped attention (Gemma 2: 256-dim heads, 2 q heads a kv head, a window on every
# other layer), with the shapes that reach each kernel.
SOFTCAP_SHAPES = {
    "gemma2_decode": (4, 2, 256, 700, [699], 16, 0, False),
    "gemma2_window_prompt": (4, 2, 256, 300, list(range(100, 300)), 16, 64, False),
    "gemma2_window_steps": (4, 2, 256, 800, [799, 100, 300], 16, 64, True),
    **{name: ATTENTION_SHAPES[name] for name in [
        "block_5", "decode_gqa_9_3", "steps", "prompt_gqa", "window_decode", "short_and_long", "long_decode",
        "long_prompt", "long_split_gqa", "long_split_hd256", "hd512_decode", "hd512_steps", "hd512_window_prompt"]},
}


@on("attention")
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("shape", list(SOFTCAP_SHAPES))
def test_attention_softcap(be, shape, kv_type, rng):
    """Attention logit soft-capping (AttentionShape::softcap): each scaled score s becomes
    cap * tanh(s / cap) before the softmax, on every kernel. Queries are scaled up so that the
    scores reach the cap and the cap changes the output well beyond the bound."""
    n_head, n_kv, hd, length, pos, bs, window, steps = SOFTCAP_SHAPES[shape]
    q = normal(rng, len(pos), n_head * hd, scale=4.0)
    k, v = normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    cap = float(rng.uniform(2.0, 6.0))
    run = lambda: be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)),
                               kv_type=kv_type, window=window, fast=steps, softcap=cap)
    if not supports(be, "kv", kv_type):
        return expect_unsupported(be, "kv", run)
    if be.name == "cuda" and kv_type == "q8_0" and (bs * n_kv * hd) % 256:
        with pytest.raises(ValueError, match="is not a multiple of 256"):
            run()
        return
    kr, vr = ref.kv_round(k, kv_type), ref.kv_round(v, kv_type)
    want = ref.attention(q, kr, vr, pos, n_head, n_kv, hd, window, softcap=cap)
    got = run()
    bound = tolerance("attention", kv_type, be)
    check(got, want, bound, f"{shape} {kv_type} softcap {cap:.3g}")
    plain = ref.attention(q, kr, vr, pos, n_head, n_kv, hd, window)
    assert rel_err(got, plain) > 5 * bound, "the cap changes the output by less than the bound: the test sees nothing"


# Chunked attention (llama 4): chunks smaller and larger than a block, not aligned to blocks or to the
# kernels' key tiles, over the shapes that reach each kernel (their windows replaced by chunks).
CHUNK_SHAPES = {
    "llama4_decode": (8, 2, 128, 700, [699, 512, 511], 16, 256, True),
    "llama4_prompt": (8, 2, 128, 300, list(range(40, 300)), 16, 37, False),
    **{name: ATTENTION_SHAPES[name] for name in [
        "block_5", "decode_gqa_9_3", "steps", "prompt_gqa", "window_decode", "short_and_long", "long_decode",
        "long_prompt", "long_split_gqa", "long_split_hd256", "hd512_steps"]},
}


@on("attention")
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("shape", list(CHUNK_SHAPES))
def test_attention_chunk(be, shape, kv_type, rng):
    """Chunked local attention (AttentionShape::chunk): a query at p sees the keys of its own chunk
    up to p, on every kernel; the output differs from full causal attention well beyond the bound."""
    n_head, n_kv, hd, length, pos, bs, window, steps = CHUNK_SHAPES[shape]
    chunk = window if window > 0 else int(rng.integers(5, 70))
    if max(pos) < chunk:
        pos = [p + chunk for p in pos if p + chunk < length] or [length - 1]
    q = normal(rng, len(pos), n_head * hd, scale=2.0)
    k, v = normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    run = lambda: be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)),
                               kv_type=kv_type, fast=steps, chunk=chunk)
    if not supports(be, "kv", kv_type):
        return expect_unsupported(be, "kv", run)
    if be.name == "cuda" and kv_type == "q8_0" and (bs * n_kv * hd) % 256:
        with pytest.raises(ValueError, match="is not a multiple of 256"):
            run()
        return
    kr, vr = ref.kv_round(k, kv_type), ref.kv_round(v, kv_type)
    want = ref.attention(q, kr, vr, pos, n_head, n_kv, hd, chunk=chunk)
    got = run()
    bound = tolerance("attention", kv_type, be)
    check(got, want, bound, f"{shape} {kv_type} chunk {chunk}")
    full = ref.attention(q, kr, vr, pos, n_head, n_kv, hd)
    assert rel_err(got, full) > 5 * bound, "the chunks change the output by less than the bound: the test sees nothing"


@on("attention")
@pytest.mark.parametrize("chunk,window", [(-1, 0), (8, 4)])
def test_attention_chunk_bad_input(be, chunk, window):
    q, kv = np.ones((2, 64), np.float32), np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="chunk must be 0 \\(none\\) or positive, and not with a window"):
        be.attention(q, kv, kv, [0, 1], 2, 1, 32, 16, chunk=chunk, window=window)


@on("attention")
@pytest.mark.parametrize("cap", [-1.0, float("inf"), float("nan")])
def test_attention_softcap_bad_input(be, cap):
    q, kv = np.ones((2, 64), np.float32), np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="softcap must be 0 \\(none\\) or a positive number"):
        be.attention(q, kv, kv, [0, 1], 2, 1, 32, 16, softcap=cap)


@on("scale_softcap")
@pytest.mark.parametrize("cap", [0.0, 30.0, 0.5], ids=["scale_only", "cap_30", "cap_0.5"])
@pytest.mark.parametrize("n", [1, 1000, 40000])
def test_scale_softcap(be, n, cap, rng):
    """x * scale, then cap * tanh(x / cap) (Gemma 2's final logits, Granite's scales); values far
    beyond the cap land on it."""
    x = rng.uniform(-100, 100, n).astype(np.float32)
    scale = float(rng.uniform(0.1, 3.0))
    check(be.scale_softcap(x, scale, cap), ref.scale_softcap(x, scale, cap), 1e-6, f"scale_softcap cap {cap}")


@on("gated_delta_rule")
@pytest.mark.parametrize("n_tok", [1, 9])
def test_gated_delta_rule(be, n_tok, rng):
    """A gated DeltaNet layer's rule (tests/test_delta_rule.py checks the rest): output and state
    against the float64 recurrence, v heads reading the k heads tiled."""
    n_k, n_v, hk, hv = 2, 4, 32, 40
    q, k = (rng.standard_normal((n_tok, n_k * hk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((n_tok, n_v * hv)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (n_tok, n_v)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n_tok, n_v)).astype(np.float32)
    state = (rng.standard_normal((n_v, hk, hv)) * 0.3).astype(np.float32)
    out, new_state = be.gated_delta_rule(q, k, v, g, beta, state, n_k)
    want_out, want_state = ref.gated_delta_rule(q, k, v, g, beta, state, n_k)
    check(out, want_out, 2e-5, "gated_delta_rule out")
    check(new_state, want_state, 2e-5, "gated_delta_rule state")


@on("short_conv")
@pytest.mark.parametrize("n_tok", [1, 2, 40])
def test_short_conv(be, n_tok, rng):
    """A causal depthwise convolution with its carried state (tests/test_short_conv.py checks the
    rest): output against float64, the state the last kernel - 1 inputs exactly."""
    channels, kernel = 300, 4
    x = rng.standard_normal((n_tok, channels)).astype(np.float32)
    w = rng.standard_normal((channels, kernel)).astype(np.float32)
    bias = rng.standard_normal(channels).astype(np.float32)
    state = rng.standard_normal((kernel - 1, channels)).astype(np.float32)
    y, new_state = be.short_conv(x, w, bias, state, True)
    want_y, want_state = ref.short_conv(x, w, bias, state, True)
    check(y, want_y, 1e-6, "short_conv y")
    same_bits(new_state, want_state, "short_conv state")


@on("ssm_scan")
@pytest.mark.parametrize("n_tok", [1, 9])
def test_ssm_scan(be, n_tok, rng):
    """Mamba2's selective scan (tests/test_ssm_scan.py checks the rest): output and state against
    the float64 recurrence, heads reading B and C groups."""
    n_head, head_dim, d_state, n_group = 8, 16, 32, 2
    xbc = rng.standard_normal((n_tok, n_head * head_dim + 2 * n_group * d_state)).astype(np.float32)
    dt = rng.uniform(-5, 2, (n_tok, n_head)).astype(np.float32)
    A, dt_bias, D = -rng.uniform(1, 16, n_head).astype(np.float32), *rng.standard_normal((2, n_head)).astype(np.float32)
    state = (rng.standard_normal((n_head, head_dim, d_state)) * 0.5).astype(np.float32)
    y, new_state = be.ssm_scan(xbc, dt, A, dt_bias, D, state, n_group)
    want_y, want_state = ref.ssm_scan(xbc, dt, A, dt_bias, D, state, n_group)
    check(y, want_y, 1e-5, "ssm_scan y")
    check(new_state, want_state, 1e-5, "ssm_scan state")


@on("attn_out")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", ["decode", "steps", "prompt"])   # widths of whole super-blocks
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_attn_out(be, t, shape, composed, rng):
    """Attention over an f16 cache, then the O projection of its output."""
    n_head, n_kv, hd, length, pos, bs, window, steps = ATTENTION_SHAPES[shape]
    width = n_head * hd
    q, k, v = normal(rng, len(pos), width), normal(rng, length, n_kv * hd), normal(rng, length, n_kv * hd)
    wo = random_weight(t, 96, width, rng)
    run = lambda: be.attention(q, k, v, pos, n_head, n_kv, hd, bs, seed=int(rng.integers(1 << 30)), window=window,
                               o_type=int(t), o_weight=wo, fast=steps, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    att = ref.attention(q, ref.kv_round(k, "f16"), ref.kv_round(v, "f16"), pos, n_head, n_kv, hd, window)
    bound = tolerance("attention", "f16", be) + tolerance("matmul", kind_of(t), be)
    check(run(), att @ dequant(t, wo, width).T, bound, f"{t.name} {shape}")


# name: (tokens, rope style, biases and per-head q/k norms (Qwen), residual)
ATTN_IN_SHAPES = {"decode": (1, False, False, False), "prompt": (5, True, True, True)}


@on("attn_in")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("shape", list(ATTN_IN_SHAPES))
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_attn_in(be, t, shape, kv_type, composed, rng):
    """A block's attention input: the residual add, the norm, Q, K, V (+ biases, + q/k norms), rope
    of q and k, and k, v stored in the cache at each token's position."""
    n_tok, neox, qwen, residual = ATTN_IN_SHAPES[shape]
    n_in, n_head, n_kv, hd = 512, 4, 2, 64
    wq, wk, wv = (random_weight(t, n * hd, n_in, rng, rms=1 / np.sqrt(n_in)) for n in (n_head, n_kv, n_kv))
    bq, bk, bv = ((normal(rng, n * hd) if qwen else None) for n in (n_head, n_kv, n_kv))
    q_norm, k_norm = (rng.uniform(0.5, 1.5, hd).astype(np.float32) if qwen else None for _ in range(2))
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    pos = sorted(int(p) for p in rng.choice(300, n_tok, replace=False))
    x, res = normal(rng, n_tok, n_in), (normal(rng, n_tok, n_in) if residual else None)
    run = lambda: be.attn_in(int(t), wq, wk, wv, n_in, x, pos, hd, 10000.0, neox, 16, norm, 1e-6, res, bq, bk, bv,
                             q_norm, k_norm, kv_type=kv_type, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    if not supports(be, "kv", kv_type):
        return expect_unsupported(be, "kv", run)
    q, k_cache, v_cache, x_sum = run()
    want_x = x if res is None else x + res
    same_bits(x_sum, want_x, "x after the residual add")
    xn = ref.rmsnorm(want_x, norm, 1e-6)

    def projected(w, b, n, head_norm, rotate):
        y = xn @ dequant(t, w, n_in).T + (0 if b is None else b)
        y = y if head_norm is None else ref.head_rmsnorm(y, head_norm, n, hd, 1e-6)
        return ref.rope(y, pos, n, hd, 10000.0, neox) if rotate else y

    bound = tolerance("matmul", kind_of(t), be) + tolerance("rope", None, be)
    check(q, projected(wq, bq, n_head, q_norm, True), bound, "q")
    cache_bound = bound + tolerance("kv", kv_type, be)
    check(k_cache, projected(wk, bk, n_kv, k_norm, True), cache_bound, f"k in the {kv_type} cache")
    check(v_cache, projected(wv, bv, n_kv, None, False), cache_bound, f"v in the {kv_type} cache")


# name: (tokens, rope style, rotated dimensions of the head of 64, attention temperature)
ATTN_IN_ROPE_SHAPES = {"phi3_decode": (1, True, 16, 0.0), "phi3_prompt": (6, True, 48, 0.0),
                       "mistral3_decode": (1, False, 64, 0.3), "mistral3_prompt": (7, False, 64, 0.2),
                       "both": (3, True, 32, 0.1)}


@on("attn_in")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "bf16", "f32"])
@pytest.mark.parametrize("shape", list(ATTN_IN_ROPE_SHAPES))
@pytest.mark.parametrize("t", [T.F32, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_attn_in_rope_options(be, t, shape, kv_type, composed, rng):
    """The attention input with partial rotary (only each head's first n_rot dimensions rotate) and
    the queries' attention temperature: q rotated then scaled by its position's temperature, k
    rotated without it, whole heads stored in the cache."""
    n_tok, neox, n_rot, temp = ATTN_IN_ROPE_SHAPES[shape]
    n_in, n_head, n_kv, hd, length = 256, 4, 2, 64, 32
    wq, wk, wv = (random_weight(t, n * hd, n_in, rng, rms=1 / np.sqrt(n_in)) for n in (n_head, n_kv, n_kv))
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    pos = sorted(int(p) for p in rng.choice(300, n_tok, replace=False))
    x = normal(rng, n_tok, n_in)
    run = lambda: be.attn_in(int(t), wq, wk, wv, n_in, x, pos, hd, 10000.0, neox, 16, norm, 1e-6, kv_type=kv_type,
                             composed=composed, n_rot=n_rot, temp_scale=temp, temp_length=length)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    if not supports(be, "kv", kv_type):
        return expect_unsupported(be, "kv", run)
    q, k_cache, v_cache, _ = run()
    xn = ref.rmsnorm(x, norm, 1e-6)
    proj = lambda w: xn @ dequant(t, w, n_in).T
    want_q = ref.rope(proj(wq), pos, n_head, hd, 10000.0, neox, n_rot=n_rot)
    if temp:
        want_q = ref.attn_temperature(want_q, pos, temp, length)
    bound = tolerance("matmul", kind_of(t), be) + tolerance("rope", None, be)
    check(q, want_q, bound, "q")
    cache_bound = bound + tolerance("kv", kv_type, be)
    check(k_cache, ref.rope(proj(wk), pos, n_kv, hd, 10000.0, neox, n_rot=n_rot), cache_bound, "k in the cache")
    check(v_cache, proj(wv), cache_bound, "v in the cache")


# ---- the feed-forward ----

FFN_SHAPES = {"one": (1, False), "few": (5, True), "prompt": (40, True)}   # name: (tokens, residual)


@on("ffn")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("shape", list(FFN_SHAPES))
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_ffn(be, t, shape, act, composed, rng):
    """A gated feed-forward: the residual add, the norm, gate and up, the gated activation, down."""
    n_tok, residual = FFN_SHAPES[shape]
    n_in, n_ff = 512, 768
    gate, up = (random_weight(t, n_ff, n_in, rng, rms=1 / np.sqrt(n_in)) for _ in range(2))
    down = random_weight(t, n_in, n_ff, rng, rms=1 / np.sqrt(n_ff))
    x, res = normal(rng, n_tok, n_in), (normal(rng, n_tok, n_in) if residual else None)
    norm = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    run = lambda: be.ffn(int(t), gate, up, down, n_in, x, norm, 1e-5, res, act, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    y, x_sum = run()
    want_x = x if res is None else x + res
    same_bits(x_sum, want_x, "x after the residual add")
    xn = ref.rmsnorm(want_x, norm, 1e-5)
    h = ref.gated_act(xn @ dequant(t, gate, n_in).T, xn @ dequant(t, up, n_in).T, act)
    check(y, h @ dequant(t, down, n_ff).T, tolerance("ffn", kind_of(t), be), f"{t.name} {shape} {act}")


# ---- the mixture of experts ----

# name: (tokens, n_seq: the batch's sequences, None: one). "few": 3 tokens pick at most 6 of the 8
# experts, so some get no token; "batch": several sequences (the CPU's fast batched kernels).
MOE_SHAPES = {"one": (1, None), "few": (3, None), "batch": (40, 4)}
# Each architecture's routing and expert options (name: moe keyword arguments; "biases": router and
# expert biases; "shared": a shared expert, "gated" with its sigmoid gate).
MOE_KINDS = {
    "qwen3moe": {"gating": "softmax", "norm_topk": True},
    "mixtral": {"gating": "softmax"},
    "gpt_oss": {"gating": "topk_softmax", "act": "swiglu_clamped", "biases": True},
    "sigmoid": {"gating": "sigmoid", "norm_topk": True, "weight_scale": 2.5, "selection_bias": True},
    "shared": {"gating": "softmax", "norm_topk": True, "shared": True},
    "shared_gated": {"gating": "softmax", "shared": "gated"},
    # llama 4: sigmoid weights scale the chosen experts' inputs; a shared expert
    "llama4": {"gating": "sigmoid", "weight_input": True, "shared": True},
}
MOE_N_EXPERT, MOE_N_USED = 8, 2


def clear_router(rng, x, n_exp, n_used, kind, router_bias, selection_bias):
    """A router whose choice no rounding can flip: the n_used-th and next scores of every token lie
    apart (backends may compute the logits in another order than float64)."""
    while True:
        router = normal(rng, n_exp, x.shape[1], scale=1 / np.sqrt(x.shape[1]))
        logits = x.astype(np.float64) @ router.T.astype(np.float64) + (0 if router_bias is None else router_bias)
        if kind.get("gating") == "sigmoid":
            logits = 1 / (1 + np.exp(-logits)) + (0 if selection_bias is None else selection_bias)
        top = np.sort(logits, axis=1)[:, ::-1]
        if np.all(top[:, n_used - 1] - top[:, n_used] > 2e-2):
            return router


def moe_case(t, kind, n_tok, rng, n_embd=256, n_ff=256, x=None):
    """Random inputs of one MoE op on normed rows x (drawn where None): (keyword arguments of
    Backend.moe, float64 reference)."""
    n_exp, n_used = MOE_N_EXPERT, MOE_N_USED
    k = dict(kind)
    x = normal(rng, n_tok, n_embd) if x is None else x
    gate, up = (random_weight(t, n_exp * n_ff, n_embd, rng, rms=1 / np.sqrt(n_embd)) for _ in range(2))
    down = random_weight(t, n_exp * n_embd, n_ff, rng, rms=1 / np.sqrt(n_ff))
    biases = {}
    if k.pop("biases", False):
        biases = {"router_bias": normal(rng, n_exp, scale=0.5), "gate_bias": normal(rng, n_exp * n_ff, scale=0.5),
                  "up_bias": normal(rng, n_exp * n_ff, scale=0.5), "down_bias": normal(rng, n_exp * n_embd, scale=0.1)}
    if k.pop("selection_bias", False):
        biases["selection_bias"] = normal(rng, n_exp, scale=0.3)
    router = clear_router(rng, x, n_exp, n_used, kind, biases.get("router_bias"), biases.get("selection_bias"))
    shared = k.pop("shared", False)
    args = {"type_id": int(t), "gate": gate, "up": up, "down": down, "router": router, "x": x, "n_used": n_used,
            **k, **biases}
    r = {**k, **{n: (b.reshape(n_exp, -1) if n in ("gate_bias", "up_bias", "down_bias") else b)
                 for n, b in biases.items()}}
    if shared:
        n_ff_s = 512 if shared == "gated" else 256   # Qwen2-MoE's shared expert is wider than its experts
        sg, su = (random_weight(t, n_ff_s, n_embd, rng, rms=1 / np.sqrt(n_embd)) for _ in range(2))
        sd = random_weight(t, n_embd, n_ff_s, rng, rms=1 / np.sqrt(n_ff_s))
        args.update(shared_gate=sg, shared_up=su, shared_down=sd)
        r["shared"] = (dequant(t, sg, n_embd), dequant(t, su, n_embd), dequant(t, sd, n_ff_s))
        if shared == "gated":
            args["shared_gate_inp"] = r["shared_gate_inp"] = normal(rng, n_embd, scale=1 / np.sqrt(n_embd))
    want = ref.moe(x, router, dequant(t, gate, n_embd).reshape(n_exp, n_ff, n_embd),
                   dequant(t, up, n_embd).reshape(n_exp, n_ff, n_embd),
                   dequant(t, down, n_ff).reshape(n_exp, n_embd, n_ff), n_used, **r)
    return args, want


@on("moe")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", list(MOE_SHAPES))
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_moe(be, t, shape, composed, rng):
    """Qwen3-MoE's routing (softmax, top-k renormalized) through every weight type: the router, the
    chosen experts' gate, up, activation and down, and the weighted sum."""
    n_tok, n_seq = MOE_SHAPES[shape]
    args, want = moe_case(t, MOE_KINDS["qwen3moe"], n_tok, rng)
    run = lambda: be.moe(**args, n_seq=n_seq, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    check(run(), want, tolerance("moe", kind_of(t), be), f"{t.name} {shape}")


@on("moe")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", list(MOE_SHAPES))
@pytest.mark.parametrize("kind", list(MOE_KINDS))
@pytest.mark.parametrize("t", [T.F32, T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_moe_kinds(be, t, kind, shape, composed, rng):
    """Each architecture's routing and expert options: the three gatings, renormalization, weight
    scale, selection, router and expert biases, gpt-oss's clamped SwiGLU, a shared expert with and
    without its gate."""
    n_tok, n_seq = MOE_SHAPES[shape]
    args, want = moe_case(t, MOE_KINDS[kind], n_tok, rng)
    run = lambda: be.moe(**args, n_seq=n_seq, composed=composed)
    if not supports(be, "weights", t):
        return expect_unsupported(be, "weights", run)
    check(run(), want, tolerance("moe", kind_of(t), be), f"{t.name} {kind} {shape}")


@on("moe")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", ["one", "few"])
def test_moe_reads_only_the_chosen_experts(be, shape, composed, rng):
    """Experts no token chose take no part: with NaN in all their weights the output is still the
    chosen experts' (a step costs the chosen experts' rows and nothing else)."""
    n_tok, _ = MOE_SHAPES[shape]
    args, want = moe_case(T.F32, MOE_KINDS["qwen3moe"], n_tok, rng)
    logits = args["x"].astype(np.float64) @ args["router"].T.astype(np.float64)
    chosen = set(ref.moe_route(logits, MOE_N_USED)[0].flat)
    assert len(chosen) < MOE_N_EXPERT
    for name in ("gate", "up", "down"):
        w = args[name].view(np.float32).reshape(MOE_N_EXPERT, -1).copy()
        w[[e for e in range(MOE_N_EXPERT) if e not in chosen]] = np.nan
        args[name] = w.reshape(args[name].shape[0], -1).view(np.uint8)
    check(be.moe(**args, composed=composed), want, tolerance("moe", "F32", be), f"{shape}: unchosen experts NaN")


@on("moe_ffn")
@pytest.mark.parametrize("composed", [False, True], ids=["fused", "composed"])
@pytest.mark.parametrize("shape", list(MOE_SHAPES))
def test_moe_ffn(be, shape, composed, rng):
    """The block's mixture feed-forward: the residual add and the norm before the experts."""
    n_tok, n_seq = MOE_SHAPES[shape]
    x, res, norm = normal(rng, n_tok, 256), normal(rng, n_tok, 256), rng.uniform(0.5, 1.5, 256).astype(np.float32)
    xn = ref.rmsnorm(x + res, norm, 1e-5)
    args, want = moe_case(T.Q8_0, MOE_KINDS["gpt_oss"], n_tok, rng, x=xn.astype(np.float32))
    got = be.moe(**{**args, "x": x}, n_seq=n_seq, composed=composed, norm=norm, residual=res)
    check(got, want, tolerance("moe", "quant", be), f"moe_ffn {shape}")


@on("moe_route")
@pytest.mark.parametrize("gating", ["softmax", "topk_softmax", "sigmoid"])
@pytest.mark.parametrize("n_tok,n_exp,n_used", [(1, 8, 2), (7, 128, 8), (33, 32, 4), (5, 4, 4)])
def test_moe_route(be, gating, n_tok, n_exp, n_used, rng):
    """Routing alone: experts in descending score, ties to the lower index (rows of equal logits,
    and a tie at the cut), weights as the gating, renormalization and scale say."""
    logits = normal(rng, n_tok, n_exp, scale=2)
    logits[0, [n_exp - 1, 0]] = 9.0   # a tie at the top: expert 0 first
    if n_tok > 2:
        logits[1, :] = 0.5            # all equal: experts 0..n_used-1
    sel = normal(rng, n_exp, scale=0.1) if gating == "sigmoid" else None
    for norm_topk, scale in [(False, 1.0), (True, 2.5)]:
        ids, w = be.moe_route(logits, n_used, gating, norm_topk, scale, sel)
        want_ids, want_w = ref.moe_route(logits, n_used, gating, norm_topk, scale,
                                         None if sel is None else sel.astype(np.float64))
        assert np.array_equal(np.asarray(ids).reshape(n_tok, n_used), want_ids), f"{gating}: ids"
        check(np.asarray(w).reshape(n_tok, n_used), want_w, 1e-6, f"{gating} weights")


@on("moe_route")
@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
@pytest.mark.parametrize("n_tok,n_exp,n_used,n_group,n_group_used", [(1, 8, 2, 4, 2), (9, 64, 6, 8, 3),
                                                                    (5, 16, 4, 4, 1), (3, 6, 2, 3, 3)])
def test_moe_route_groups(be, gating, n_tok, n_exp, n_used, n_group, n_group_used, rng):
    """Group-limited routing (DeepSeek V2 / V3): only the experts of the best groups by the sum of their two
    best scores (row 0: one very good expert in group 0, two good ones in group 1, which sigmoid's sum ranks
    higher and softmax's lower); a tie between groups goes to the lower one (row 1)."""
    logits = normal(rng, n_tok, n_exp, scale=2)
    per = n_exp // n_group
    logits[0, :] = -3.0
    logits[0, per - 1] = 8.0                      # group 0: one very good expert
    logits[0, 2 * per - 2:2 * per] = 6.0          # group 1: two good ones, which sum higher
    if n_tok > 1 and n_group_used < n_group:
        logits[1, :] = 0.25                       # every group ties: the lowest ones are kept
    sel = normal(rng, n_exp, scale=0.1) if gating == "sigmoid" else None
    ids, w = be.moe_route(logits, n_used, gating, True, 2.5, sel, n_group, n_group_used)
    want_ids, want_w = ref.moe_route(logits, n_used, gating, True, 2.5,
                                     None if sel is None else sel.astype(np.float64), n_group, n_group_used)
    assert np.array_equal(np.asarray(ids).reshape(n_tok, n_used), want_ids), f"{gating}: ids"
    check(np.asarray(w).reshape(n_tok, n_used), want_w, 1e-6, f"{gating} weights")


@on("gather_rows")
@pytest.mark.parametrize("n,dim,rows", [(1, 64, [0]), (9, 1001, [3, 0, 8, 3]), (70, 2048, list(range(69, -1, -2)))])
def test_gather_scatter_rows(be, n, dim, rows, rng):
    """Rows by index and back, weighted: the moe's gather of a group's rows and its scatter-add."""
    x = normal(rng, n, dim)
    same_bits(be.gather_rows(x, rows), x[rows], "gathered rows")
    rows = list(dict.fromkeys(rows))   # a scatter's rows are distinct
    y, scale = normal(rng, len(rows), dim), normal(rng, len(rows))
    want = x.astype(np.float64).copy()
    want[rows] += scale[:, None].astype(np.float64) * y
    check(be.scatter_add_rows(x, y, rows, scale), want, 1e-6, "scatter-added rows")


@on("sigmoid")
@pytest.mark.parametrize("n", [1, 1000, 40000])
def test_sigmoid(be, n, rng):
    x = rng.uniform(-100, 100, n).astype(np.float32)
    check(be.sigmoid(x), 1 / (1 + np.exp(-x.astype(np.float64))), 1e-6, "sigmoid")


@on("mul")
@pytest.mark.parametrize("n", [1, 1000, 40000])
def test_mul(be, n, rng):
    """The elementwise product rounds once: every backend gives numpy's float32 product bit for bit."""
    x, y = normal(rng, n), normal(rng, n)
    same_bits(be.mul(x, y), x * y, "mul")


@on("softplus_gate")
@pytest.mark.parametrize("n_tok,dim", [(1, 4), (9, 32), (300, 48)])
def test_softplus_gate(be, n_tok, dim, rng):
    """scale * softplus(x + bias) per column (a gated DeltaNet's decay), across softplus's linear branch
    (above 20) and far below 0."""
    x = rng.uniform(-40, 40, (n_tok, dim)).astype(np.float32)
    bias, scale = normal(rng, dim), -np.exp(normal(rng, dim)).astype(np.float32)
    v = x.astype(np.float64) + bias
    want = scale * np.where(v > 20, v, np.log1p(np.exp(np.minimum(v, 20))))
    check(be.softplus_gate(x, bias, scale), want, 1e-6, "softplus_gate")


@on("copy_rows")
@pytest.mark.parametrize("case", [
    (0, 8, 3, 24, 8, 5),        # a column range of a fused projection's rows
    (1, 3, 0, 7, 2, 40),        # rows spread out with gaps
    (5, 16, 0, 4, 4, 6),        # packed rows into wider ones
    (2, 100, 9, 100, 100, 1),   # one row: the strides are not read
    (0, 4, 0, 4, 4, 0),         # nothing
], ids=["columns", "spread", "widen", "one_row", "none"])
def test_copy_rows(be, case, rng):
    """Exactly the rows asked for land, at their strides; dst's other elements are untouched."""
    dst_at, dst_stride, src_at, src_stride, width, n_rows = case
    src = normal(rng, src_at + max(n_rows - 1, 0) * src_stride + width + 3)
    dst = normal(rng, dst_at + max(n_rows - 1, 0) * dst_stride + width + 2)
    want = dst.copy()
    for r in range(n_rows):
        want[dst_at + r * dst_stride:][:width] = src[src_at + r * src_stride:][:width]
    same_bits(be.copy_rows(dst, dst_at, dst_stride, src, src_at, src_stride, width, n_rows), want, "copy_rows")


@pytest.mark.parametrize("be", [pytest.param((n, None), id=n) for n in BACKENDS], indirect=True)
def test_copy_rows_bad_arguments(be, rng):
    x = normal(rng, 64)
    with pytest.raises(ValueError, match="strides .* at least the width"):
        be.copy_rows(x, 0, 4, x.copy(), 0, 8, 8, 4)
    with pytest.raises(ValueError, match="must be >= 0"):
        be.copy_rows(x, 0, 8, x.copy(), 0, 8, -1, 2)


@pytest.mark.parametrize("be", [pytest.param((n, None), id=n) for n in BACKENDS], indirect=True)
def test_moe_bad_arguments(be, rng):
    """Bad MoE input raises ValueError naming what was wrong."""
    args, _ = moe_case(T.F32, MOE_KINDS["qwen3moe"], 2, rng, n_embd=32, n_ff=32)
    for n_used in (0, -1, MOE_N_EXPERT + 1):
        with pytest.raises(ValueError, match=f"n_used {n_used} must lie in 1..{MOE_N_EXPERT}"):
            be.moe(**{**args, "n_used": n_used})
        with pytest.raises(ValueError, match="n_used"):
            be.moe_route(np.ones((2, MOE_N_EXPERT), np.float32), n_used)
    with pytest.raises(ValueError, match="up must be"):
        be.moe(**{**args, "up": args["up"][:-32]})
    with pytest.raises(ValueError, match="down must be"):
        be.moe(**{**args, "down": args["gate"][:, :64]})
    with pytest.raises(ValueError, match="gate must stack"):
        be.moe(**{**args, "gate": args["gate"][:-1]})
    with pytest.raises(ValueError, match="x must be"):
        be.moe(**{**args, "x": normal(rng, 2, 48)})
    with pytest.raises(ValueError, match="gating must be"):
        be.moe(**{**args, "gating": "relu"})
    with pytest.raises(ValueError, match="gate_bias must be"):
        be.moe(**args, gate_bias=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="shared expert needs"):
        be.moe(**args, shared_gate=args["gate"][:32])
    with pytest.raises(ValueError, match="rows repeat"):
        be.scatter_add_rows(normal(rng, 4, 8), normal(rng, 2, 8), [1, 1], normal(rng, 2))
    with pytest.raises(ValueError, match="row 4 is outside"):
        be.gather_rows(normal(rng, 4, 8), [4])


@pytest.mark.parametrize("t", [T.F32, T.F16, T.Q8_0, T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", list(MOE_SHAPES))
def test_cpu_grouped_moe_is_the_composition(t, shape, rng):
    """The CPU's grouped moe gives its default composition's bits: the same kernels on the same
    gathered rows, each token's experts summed in ascending order."""
    backend = make_backend("cpu", None)
    n_tok, n_seq = MOE_SHAPES[shape]
    for kind in ("qwen3moe", "gpt_oss", "shared_gated"):
        args, _ = moe_case(t, MOE_KINDS[kind], n_tok, rng)
        same_bits(backend.moe(**args, n_seq=n_seq), backend.moe(**args, n_seq=n_seq, composed=True), f"{kind}")


# ---- bad input ----

@pytest.mark.parametrize("be", [pytest.param((n, None), id=n) for n in BACKENDS], indirect=True)
def test_bad_arguments(be):
    """Bad input raises ValueError naming what was wrong, on every backend."""
    x = np.ones((2, 48), np.float32)
    with pytest.raises(ValueError, match="backend 'tpu' is not built"):
        K.Backend("tpu", 1)
    with pytest.raises(ValueError, match="EMBER_NO_SUCH_SWITCH"):
        K.Backend(be.name, 1, switches={"EMBER_NO_SUCH_SWITCH": "1"})
    with pytest.raises(ValueError, match="act must be"):
        be.gated_act(np.ones(4, np.float32), np.ones(4, np.float32), "relu")
    with pytest.raises(ValueError, match="freq_factors must be"):
        be.rope(np.ones((1, 64), np.float32), [0], 1, 64, 10000.0, False, freq_factors=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="window must be"):
        be.attention(np.ones((1, 32), np.float32), np.ones((2, 32), np.float32), np.ones((2, 32), np.float32), [1],
                     1, 1, 32, 16, window=-1)
    with pytest.raises(ValueError, match="weight must be"):
        be.matmul(int(T.Q4_0), np.zeros((4, 10), np.uint8), 32, np.ones((1, 32), np.float32))
    with pytest.raises(ValueError, match="unknown type id 200"):   # no ggml type has this id
        be.matmul(200, np.zeros((4, 66), np.uint8), 256, np.ones((1, 256), np.float32))
    with pytest.raises(ValueError, match="argmax_rows"):
        be.argmax_rows(np.zeros((0, 4), np.float32))
    with pytest.raises(ValueError, match="add: x and y"):
        be.add(np.ones(3, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        be.copy(np.zeros(8, np.uint8), 4, 0, 5)
    with pytest.raises(ValueError, match="prepare_vector: 4 F16 elements need 8 bytes"):
        be.prepare_vector(int(T.F16), np.zeros(6, np.uint8), 4)
    with pytest.raises(ValueError, match="position 9 outside"):
        be.kv_store(x[:1], x[:1], [9], [0], 1, 9, 1, 48, 16)
    with pytest.raises(ValueError, match="sequence 2 outside"):
        be.kv_store(x[:1], x[:1], [0], [2], 2, 9, 1, 48, 16)
    # KV types: a q8_0 group must not straddle two heads
    with pytest.raises(ValueError, match="head_dim 48"):
        be.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q8_0")
    with pytest.raises(ValueError, match="type_v: a Q8_0 KV cache needs .*head_dim 48"):
        be.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, type_v="q8_0")
    with pytest.raises(ValueError, match="type_k: a Q4_1 KV cache needs .*head_dim 48"):
        be.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, type_k="q4_1")
    with pytest.raises(ValueError, match="kv_type.*'q6_k'"):
        be.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="q6_k")
    with pytest.raises(ValueError, match="type_k.*'q6_k'"):
        be.kv_store(x, x, [0, 1], [0, 0], 1, 2, 1, 48, 16, type_k="q6_k")
    with pytest.raises(ValueError, match="kv_type .*or type_k / type_v, not both"):
        be.attention(x, x, x, [0, 1], 1, 1, 48, 16, 0, kv_type="f16", type_v="f32")


# ---- the CPU's SIMD levels ----

@pytest.mark.parametrize("level", ["avx2", "avx512"])
def test_cpu_gated_act_simd_matches_scalar_bit_for_bit(level, rng):
    """The SIMD gated activations (src/cpu/activation_avx*.cpp: expf in double as glibc's FMA build)
    give the scalar loop's bits, across expf's whole range and its special cases."""
    top = K.simd_level()
    if level != top and level not in simd_levels_below(top):
        pytest.skip(f"this CPU's kernels run at {top}: no {level} here")
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 88.72, 88.73, -87.3, -103.9, -104.0, -150.0, 1e30, -1e30,
                      np.inf, -np.inf, np.nan, 0.5, -0.5], np.float32)
    g = np.concatenate([edges, rng.uniform(-120, 100, 40000).astype(np.float32), normal(rng, 3001, scale=4)])
    u = normal(rng, g.size)
    scalar = K.Backend("cpu", 2, switches={"EMBER_SIMD": "scalar"})
    simd = K.Backend("cpu", 2, switches={"EMBER_SIMD": level})
    for act in ("silu", "gelu_tanh", "swiglu_clamped"):
        same_bits(simd.gated_act(g, u, act), scalar.gated_act(g, u, act), act)


@on("layernorm")
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("shape", list(NORM_SHAPES))
def test_layernorm(be, shape, bias, rng):
    """Rows with an offset far from zero too: the mean must be taken out before the variance."""
    n_tok, dim = NORM_SHAPES[shape]
    x = normal(rng, n_tok, dim) * rng.uniform(0.1, 5, (n_tok, 1)).astype(np.float32)
    x += rng.uniform(-20, 20, (n_tok, 1)).astype(np.float32)
    g, b = normal(rng, dim), (normal(rng, dim) if bias else None)
    check(be.layernorm(x, g, b, 1e-12), ref.layernorm(x, g, b, 1e-12), tolerance("layernorm", None, be), shape)


@on("unary")
@pytest.mark.parametrize("f", ["gelu_erf", "gelu_tanh", "tanh", "relu_squared"])
@pytest.mark.parametrize("n", [33, 10007])
def test_unary(be, f, n, rng):
    x = normal(rng, n, scale=4)
    x[:8] = [0.0, -0.0, 30.0, -30.0, 1e-20, -1e-20, 9.0, -9.0]
    check(be.unary(x, f), ref.unary(x, f), tolerance("unary", None, be), f)


# name: (sequence lengths, n_head, n_head_kv, head_dim, window)
ENCODER_CASES = {"one": ([7], 4, 4, 64, 0), "packed": ([5, 1, 12, 3], 4, 2, 32, 0),
                 "gqa_80": ([9, 16], 6, 2, 80, 0), "head_256": ([4, 6], 2, 1, 256, 0),
                 "window": ([20, 11], 4, 4, 64, 5), "long": ([300, 40], 2, 2, 64, 0)}


@on("encoder_attention")
@pytest.mark.parametrize("case", list(ENCODER_CASES))
def test_encoder_attention(be, case, rng):
    """Sequences packed one after another, each token seeing all of its own sequence and none of
    the others (a token placed in the wrong sequence changes its row)."""
    lens, H, Hkv, D, window = ENCODER_CASES[case]
    seq = [s for s, n in enumerate(lens) for _ in range(n)]
    pos = [p for n in lens for p in range(n)]
    n = len(seq)
    q, k, v = normal(rng, n, H * D), normal(rng, n, Hkv * D), normal(rng, n, Hkv * D)
    scale = float(rng.uniform(0.05, 0.3))
    got = be.encoder_attention(q, k, v, pos, seq, H, Hkv, D, scale, window)
    want = ref.encoder_attention(q, k, v, pos, seq, H, Hkv, D, scale, window)
    check(got, want, tolerance("encoder_attention", None, be), case)


@pytest.mark.parametrize("be", [pytest.param((n, None), id=n) for n in BACKENDS], indirect=True)
def test_encoder_ops_bad_arguments(be, rng):
    q, kv = normal(rng, 4, 96), normal(rng, 4, 64)
    with pytest.raises(ValueError, match="multiple of n_head_kv"):
        be.encoder_attention(q, kv, kv, [0, 1, 2, 3], [0, 0, 0, 0], 3, 2, 32, 0.1)
    q = kv
    with pytest.raises(ValueError, match="window must be >= 0"):
        be.encoder_attention(q, q, q, [0, 1, 2, 3], [0, 0, 0, 0], 2, 2, 32, 0.1, -1)
    with pytest.raises(ValueError, match="unary: f must be"):
        be.unary(normal(rng, 4), "relu")
    if be.is_host:   # the CPU checks the batch; the GPU's kernel takes each run of a sequence as it comes
        with pytest.raises(ValueError, match="sequence 0 are not contiguous"):
            be.encoder_attention(q, q, q, [0, 0, 1, 1], [0, 1, 0, 1], 2, 2, 32, 0.1)
