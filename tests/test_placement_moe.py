"""Placement tensor by tensor (src/model/placement.cpp): -ot/--override-tensor, --cpu-moe, --n-cpu-moe
and the GPU budget on a tiny Qwen3-MoE file, as a plan (placement_plan: no GPU needed) and as runs: the
same logits with the experts on the CPU as without, on the CPU build and, where CUDA is built in and a
device is present, with the blocks on the GPU and their experts on the CPU."""
import gzip
import importlib.util
import math

import numpy as np
import pytest
from gguf import GGUFReader

from conftest import ROOT
from ember import LLM, Llama, SamplingParams, _ember, bench, cli, options, perplexity
from ember.server import args as server_args
from ember.switches import overridden

_spec = importlib.util.spec_from_file_location("synthetic_gguf", ROOT / "tools" / "synthetic_gguf.py")
synthetic_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic_gguf)

SHAPE = synthetic_gguf.SHAPES["qwen3moe-tiny"]
N_LAYER = SHAPE.n_layers
EXPERT_TENSORS = ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
MIB = 1 << 20


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe")
    vocab = folder / "smollm2-vocab.gguf"
    vocab.write_bytes(gzip.decompress((ROOT / "tests" / "fuzz" / "vocab" / "smollm2.gguf.gz").read_bytes()))
    out = str(folder / "qwen3moe-tiny.gguf")
    synthetic_gguf.write_model(out, "qwen3moe-tiny", str(vocab), ctx=256,
                               seed=int(np.random.default_rng().integers(2**31)))
    return out


@pytest.fixture(scope="module")
def sizes(moe_path):
    return {t.name: int(t.n_bytes) for t in GGUFReader(moe_path).tensors}


def plan(path, **fields):
    fields.setdefault("n_gpu_layers", -1)
    return _ember.placement_plan(path, **fields)


def expert_devices(p, layer):
    return {p["tensors"][f"blk.{layer}.{name}"] for name in EXPERT_TENSORS}


def attention_device(p, layer):
    return p["tensors"][f"blk.{layer}.attn_q.weight"]


# ---- the plan -------------------------------------------------------------------------------------
def test_all_on_the_gpu(moe_path):
    p = plan(moe_path)
    assert p["blocks"] == p["experts"] == ["CUDA"] * N_LAYER and p["head"] == "CUDA"
    assert {d for n, d in p["tensors"].items() if n != "token_embd.weight"} == {"CUDA"}
    assert p["tensors"]["token_embd.weight"] == "CPU"   # its rows are read in host memory
    assert p["summary"].startswith("placement: CUDA ") and "experts of blocks" not in p["summary"]
    assert p["warning"] == ""


def test_cpu_moe_keeps_attention_on_the_gpu(moe_path):
    p = plan(moe_path, cpu_moe=True)
    assert p["blocks"] == ["CUDA"] * N_LAYER and p["experts"] == ["CPU"] * N_LAYER
    for layer in range(N_LAYER):
        assert expert_devices(p, layer) == {"CPU"}   # the router goes with its experts
        assert attention_device(p, layer) == "CUDA"
        assert p["tensors"][f"blk.{layer}.ffn_norm.weight"] == "CUDA"
    assert f"experts of blocks 0-{N_LAYER - 1} on the CPU" in p["summary"]


@pytest.mark.parametrize("n", range(N_LAYER + 1))
def test_n_cpu_moe_takes_the_first_blocks(moe_path, n):
    p = plan(moe_path, n_cpu_moe=n)
    assert p["experts"] == ["CPU"] * n + ["CUDA"] * (N_LAYER - n)
    assert p["blocks"] == ["CUDA"] * N_LAYER


def test_override_tensor_first_match_decides(moe_path):
    p = plan(moe_path, override_tensor=[r"blk\.0\.ffn_.*exps=CUDA", "exps=CPU"])
    assert p["experts"] == ["CUDA"] + ["CPU"] * (N_LAYER - 1)
    # override_tensor comes before cpu_moe and n_cpu_moe, as a later -ot cannot undo them in llama.cpp.
    p = plan(moe_path, override_tensor=[r"blk\.1\.ffn_.*_exps=CUDA0"], cpu_moe=True)
    assert p["experts"] == ["CPU", "CUDA"] + ["CPU"] * (N_LAYER - 2)
    p = plan(moe_path, override_tensor=[r"blk\.0\.ffn_.*_exps=gpu"], n_cpu_moe=2)
    assert p["experts"][:2] == ["CUDA", "CPU"]


def test_override_tensor_comma_list_and_repeats_alike(moe_path):
    a = plan(moe_path, override_tensor=[r"blk\.2\.ffn_up_exps=CPU,blk\.[23]\.ffn_.*_exps=cpu"])
    b = plan(moe_path, override_tensor=[r"blk\.2\.ffn_up_exps=CPU", r"blk\.[23]\.ffn_.*_exps=cpu"])
    assert a == b and a["experts"] == ["CUDA", "CUDA", "CPU", "CPU"]


def test_override_moves_a_whole_block(moe_path):
    p = plan(moe_path, override_tensor=[r"blk\.1\.=CPU"])
    assert p["blocks"] == ["CUDA", "CPU", "CUDA", "CUDA"] and p["experts"] == p["blocks"]
    assert attention_device(p, 1) == "CPU" and expert_devices(p, 1) == {"CPU"}
    p = plan(moe_path, n_gpu_layers=0, override_tensor=[r"blk\.3\.=CUDA"])
    assert p["blocks"] == ["CPU", "CPU", "CPU", "CUDA"] and p["head"] == "CUDA"
    p = plan(moe_path, override_tensor=[r"^output\.weight=CPU", "output_norm=CPU"])
    assert p["head"] == "CPU" and p["blocks"] == ["CUDA"] * N_LAYER


def test_cpu_only_build_runs_everything_on_the_cpu(moe_path):
    p = plan(moe_path, have_gpu=False, cpu_moe=True)
    assert set(p["tensors"].values()) == {"CPU"} and p["blocks"] == p["experts"] == ["CPU"] * N_LAYER
    assert "n_gpu_layers=-1 ignored" in p["warning"]
    assert p["summary"].startswith("placement: CPU 51 tensors, ") and "CUDA" not in p["summary"]
    p = plan(moe_path, have_gpu=False, n_gpu_layers=0, override_tensor=["attn=CUDA"])
    assert set(p["tensors"].values()) == {"CPU"} and "override_tensor ignored" in p["warning"]
    assert plan(moe_path, have_gpu=False, n_gpu_layers=0)["warning"] == ""


def _gpu_bytes(sizes, expert_layers):
    """Bytes on the GPU with every block there and the experts of expert_layers with them."""
    return sum(b for n, b in sizes.items() if n != "token_embd.weight" and not any(
        n.startswith(f"blk.{layer}.") and "exp" in n or n.startswith(f"blk.{layer}.ffn_gate_inp")
        for layer in range(N_LAYER) if layer not in expert_layers))


def _staging(sizes):
    """The GPU staging of streamed experts: two blocks' MoE tensors."""
    return 2 * max(sum(b for n, b in sizes.items() if n.startswith(f"blk.{layer}.") and
                       ("exp" in n or "ffn_gate_inp" in n)) for layer in range(N_LAYER))


# Experts apart from their block take two blocks' experts of staging, so a budget keeps every
# block's experts, or at most N_LAYER - 3 of them.
@pytest.mark.parametrize("kept", [0, 1, N_LAYER])
def test_budget_keeps_the_last_blocks_experts(moe_path, sizes, kept):
    last = set(range(N_LAYER - kept, N_LAYER))
    staging = 0 if kept == N_LAYER else _staging(sizes)
    budget_mb = math.ceil((_gpu_bytes(sizes, last) + staging) / MIB)
    assert kept == N_LAYER or _gpu_bytes(sizes, last | {N_LAYER - kept - 1}) + staging > budget_mb * MIB
    p = plan(moe_path, moe_gpu_budget_mb=budget_mb)
    assert p["experts"] == ["CPU"] * (N_LAYER - kept) + ["CUDA"] * kept
    assert p["blocks"] == ["CUDA"] * N_LAYER and p["warning"] == ""
    assert f"GPU budget {budget_mb:.1f} MiB" in p["summary"]
    if kept < N_LAYER:
        assert "moved to the CPU" in p["summary"] and "layer order" in p["summary"]
        assert f"{staging / MIB:.1f} MiB kept for streaming them" in p["summary"]


def test_budget_moves_no_fewer_than_three_blocks(moe_path, sizes):
    all_mb = _gpu_bytes(sizes, set(range(N_LAYER))) / MIB
    p = plan(moe_path, moe_gpu_budget_mb=math.floor(all_mb - 0.1))
    assert p["experts"] == ["CPU"] * (N_LAYER - 1) + ["CUDA"]


def test_budget_defaults_to_free_memory_when_the_experts_do_not_fit(moe_path, sizes):
    need_mb = math.ceil(_gpu_bytes(sizes, set(range(N_LAYER))) / MIB)
    fits = plan(moe_path, gpu_free_mb=need_mb + 1024)
    assert fits["experts"] == ["CUDA"] * N_LAYER and "budget" not in fits["summary"]
    free_mb = math.ceil((_gpu_bytes(sizes, {N_LAYER - 1}) + _staging(sizes)) / MIB) + 1024
    p = plan(moe_path, gpu_free_mb=free_mb)
    assert p["experts"] == ["CPU"] * (N_LAYER - 1) + ["CUDA"]
    assert "free memory less 1 GiB" in p["summary"]
    assert plan(moe_path, gpu_free_mb=free_mb, moe_gpu_budget_mb=-1)["experts"] == ["CUDA"] * N_LAYER
    assert plan(moe_path, gpu_free_mb=0)["experts"] == ["CUDA"] * N_LAYER   # 0: not known


def test_budget_too_small_for_the_rest_says_so(moe_path):
    p = plan(moe_path, moe_gpu_budget_mb=1)
    assert p["experts"] == ["CPU"] * N_LAYER and p["blocks"] == ["CUDA"] * N_LAYER
    assert "of staging), over the GPU budget of 1.0 MiB" in p["warning"] and "lower n_gpu_layers" in p["warning"]


def test_dense_blocks_have_no_experts_apart(moe_path):
    p = plan(moe_path, n_gpu_layers=2, cpu_moe=True)
    assert p["blocks"] == ["CPU", "CPU", "CUDA", "CUDA"] and p["experts"] == ["CPU"] * N_LAYER
    assert "experts of blocks 2-3 on the CPU" in p["summary"]


BAD_PLANS = [
    (dict(override_tensor=[r"blk\.[=CPU"]), r"override_tensor: 'blk\\\.\[' is not a valid regular expression"),
    (dict(override_tensor=["exps=Metal"]), "override_tensor: unknown device 'Metal' .CPU or CUDA."),
    (dict(override_tensor=["exps=CUDA1"]), "device 'CUDA1': ember drives one GPU, main_gpu 0"),
    (dict(override_tensor=["exps"]), "override_tensor: 'exps' must be REGEX=DEVICE"),
    (dict(override_tensor=["=CPU"]), "override_tensor: '=CPU' must be REGEX=DEVICE"),
    (dict(override_tensor=["exps=CPU,"]), "override_tensor: '' must be REGEX=DEVICE"),
    (dict(n_cpu_moe=N_LAYER + 1), f"n_cpu_moe {N_LAYER + 1} is more than the model's {N_LAYER} blocks"),
    (dict(n_cpu_moe=-1), "n_cpu_moe must be >= 0"),
    (dict(moe_gpu_budget_mb=-2), "moe_gpu_budget_mb must be -1"),
    (dict(override_tensor=[r"blk\.1\.attn_q=CPU"]), "attention, norms and dense tensors stay together"),
    (dict(override_tensor=[r"blk\.1\.ffn_gate_exps=CPU"]), "a block's experts stay together"),
    (dict(n_gpu_layers=0, override_tensor=["exps=CUDA"]), "experts run on the GPU only with their block there"),
    (dict(override_tensor=[r"^output\.weight=CPU"]), "the output head stays together"),
]


@pytest.mark.parametrize("fields,match", BAD_PLANS)
def test_bad_placements_name_the_option(moe_path, fields, match):
    with pytest.raises(ValueError, match=match):
        plan(moe_path, **fields)


def test_main_gpu_names_its_device(moe_path):
    p = plan(moe_path, main_gpu=1, override_tensor=[r"blk\.0\.ffn_.*_exps=CUDA1"], cpu_moe=True)
    assert p["experts"] == ["CUDA"] + ["CPU"] * (N_LAYER - 1)
    with pytest.raises(ValueError, match="device 'CUDA0': ember drives one GPU, main_gpu 1"):
        plan(moe_path, main_gpu=1, override_tensor=["exps=CUDA0"])


# ---- the options ----------------------------------------------------------------------------------
PARSERS = {options.EMBER: (cli._parser, ["-m", "x.gguf", "-p", "hi"]),
           options.BENCH: (bench.parser, ["-m", "x.gguf"]),
           options.PERPLEXITY: (perplexity.parser, ["-m", "x.gguf", "-f", "t.txt"]),
           options.SERVER: (server_args.parser, ["-m", "x.gguf"])}


@pytest.mark.parametrize("front_end", PARSERS)
def test_every_cli_takes_the_placement_flags(front_end):
    make, needed = PARSERS[front_end]
    args = make().parse_args([*needed, "-ot", r"blk\.0\.=CPU,exps=cuda", "--override-tensor", "attn=CUDA0",
                              "-cmoe", "-ncmoe", "3", "--moe-gpu-budget", "12288"])
    assert args.override_tensor == [r"blk\.0\.=CPU", "exps=cuda", "attn=CUDA0"]
    assert (args.cpu_moe, args.n_cpu_moe, args.moe_gpu_budget_mb) == (True, 3, 12288)
    args = make().parse_args(needed)
    assert (args.override_tensor, args.cpu_moe, args.n_cpu_moe, args.moe_gpu_budget_mb) == (None, False, 0, 0)
    params = options.fill(_ember.ModelParams(), {"override_tensor": None, "n_cpu_moe": 2})
    assert params.override_tensor == [] and params.n_cpu_moe == 2


@pytest.mark.parametrize("argv,named", [(["-ot", "exps=Metal"], "unknown device 'Metal'"),
                                        (["-ot", "exps"], "REGEX=DEVICE"), (["-ncmoe", "-1"], "must be >= 0"),
                                        (["--moe-gpu-budget", "-2"], "must be >= -1"),
                                        (["--cpu-moe", "2"], "must be 0 or 1")])
@pytest.mark.parametrize("front_end", PARSERS)
def test_cli_bad_placement_values(front_end, argv, named, capsys):
    make, needed = PARSERS[front_end]
    with pytest.raises(SystemExit):
        make().parse_args([*needed, *argv])
    err = capsys.readouterr().err
    assert argv[0] in err and named in err, err


def test_python_front_ends_check_the_options(moe_path):
    with pytest.raises(ValueError, match="Llama: override_tensor names unknown device 'Metal'"):
        Llama(moe_path, override_tensor="exps=Metal")
    with pytest.raises(ValueError, match="LLM: n_cpu_moe must be >= 0"):
        LLM(moe_path, n_cpu_moe=-1)
    with pytest.raises(ValueError, match="is not a valid regular expression"):
        Llama(moe_path, override_tensor=r"blk\.(=CPU", verbose=False)
    with pytest.raises(ValueError, match="n_cpu_moe 9 is more than the model's 4 blocks"):
        _ember.Model(moe_path, n_cpu_moe=9)


# ---- runs -------------------------------------------------------------------------------------------
def _logits(path, rng_seed, prompt_len=9, **model_fields):
    """The logits of a prompt (one batch) and of three tokens after it (one by one)."""
    rng = np.random.default_rng(rng_seed)
    model = _ember.Model(path, **model_fields)
    ctx = _ember.Context(model, n_ctx=128, n_batch=64, n_threads=2)
    ctx.eval(rng.integers(0, model.n_vocab, prompt_len).tolist(), True)
    out = [np.asarray(ctx.all_logits())]
    for _ in range(3):
        ctx.eval([int(rng.integers(0, model.n_vocab))])
        out.append(np.asarray(ctx.logits())[None])
    return np.concatenate(out), model


def test_cpu_build_with_cpu_moe_gives_the_same_logits(moe_path, rng):
    seed = int(rng.integers(2**31))
    ref, _ = _logits(moe_path, seed)
    assert np.isfinite(ref).all() and ref.std() > 0
    for fields in (dict(cpu_moe=True), dict(n_cpu_moe=1), dict(override_tensor=["exps=CPU"])):
        got, model = _logits(moe_path, seed, **fields)
        assert np.array_equal(got, ref), fields
        if "cuda" not in _ember.backends():
            assert set(model.placement["tensors"].values()) == {"CPU"}


def _cuda_or_skip():
    if "cuda" not in _ember.backends():
        pytest.skip(f"this ember was built without the CUDA backend (built in: {_ember.backends()})")


GPU_PLACEMENTS = [dict(cpu_moe=True), dict(n_cpu_moe=1), dict(override_tensor=[r"blk\.[13]\.ffn_.*_exps=CPU"]),
                  dict(n_gpu_layers=2, cpu_moe=True), dict(moe_gpu_budget_mb=1)]


@pytest.mark.parametrize("fields", GPU_PLACEMENTS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_gpu_with_experts_on_the_cpu_matches_all_gpu(moe_path, rng, fields):
    _cuda_or_skip()
    seed = int(rng.integers(2**31))
    try:
        ref, _ = _logits(moe_path, seed, n_gpu_layers=-1)
    except ValueError as e:
        pytest.skip(f"no CUDA device: {e}")
    cpu, _ = _logits(moe_path, seed)
    got, model = _logits(moe_path, seed, **{"n_gpu_layers": -1, **fields})
    assert "CPU" in model.placement["experts"]
    scale = np.abs(cpu).max()
    # f16 weights and an f16 KV cache on every device: the devices' sums differ in rounding only.
    assert np.abs(got - ref).max() <= 2e-2 * scale
    assert np.abs(got - cpu).max() <= 2e-2 * scale
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75


@pytest.mark.parametrize("stream", ["1", "0"], ids=["experts_streamed", "experts_on_cpu"])
def test_gpu_long_prompt_with_experts_on_the_cpu(moe_path, rng, stream):
    """A prompt of 48 tokens: by default its step streams the CPU experts to the GPU
    (remote_experts.h's ExpertStream); EMBER_STREAM=0 keeps them on the CPU."""
    _cuda_or_skip()
    seed = int(rng.integers(2**31))
    try:
        ref, _ = _logits(moe_path, seed, prompt_len=48, n_gpu_layers=-1)
    except ValueError as e:
        pytest.skip(f"no CUDA device: {e}")
    with overridden(EMBER_STREAM=stream):
        got, _ = _logits(moe_path, seed, prompt_len=48, n_gpu_layers=-1, n_cpu_moe=3)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.75


def test_engine_batch_with_experts_on_the_cpu(moe_path, rng):
    _cuda_or_skip()
    # Prompts of up to 60 tokens: the steps holding their chunks stream the experts.
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(3, 60, 5)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def run(**fields):
        with LLM(moe_path, n_ctx=128, max_num_seqs=4, **fields) as llm:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
            return [o.outputs[0].token_ids for o in outs]

    try:
        ref = run(n_gpu_layers=-1)
    except ValueError as e:
        pytest.skip(f"no CUDA device: {e}")
    for fields in (dict(cpu_moe=True), dict(n_cpu_moe=2)):
        got = run(n_gpu_layers=-1, **fields)
        same = sum(a == b for a, b in zip(got, ref))
        assert same >= len(ref) - 1, (fields, got, ref)


def test_bench_shows_the_placement_columns(moe_path, capsys):
    assert bench.main(["-m", moe_path, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-cmoe", "-ncmoe", "1",
                       "-ot", r"blk\.3\.ffn_.*_exps=CPU"]) == 0
    header, _, row = capsys.readouterr().out.splitlines()[:3]
    assert "| n_cpu_moe | cpu_moe | ot | test |" in header
    assert r"| 1 | 1 | blk\.3\.ffn_.*_exps=CPU | pp8 |" in row
