"""LLM and AsyncLLMEngine as vLLM's users drive them (issue 43): an offline script run unchanged,
vLLM's engine arguments (gpu_memory_utilization, dtype, kv_cache_dtype, swap_space,
tensor_parallel_size, trust_remote_code), no stray __del__ traceback, from_engine_args and an
awaitable abort."""
import asyncio
import subprocess
import sys

import pytest

from ember import LLM, AsyncEngineArgs, AsyncLLMEngine, EngineArgs, SamplingParams
from ember.devices import CudaDevice
from ember.engine_args import GPU_HEADROOM_MB, MIB, kv_mb_for_utilization


def test_a_vllm_offline_script_runs_unchanged(smollm2_path):
    """vLLM's quickstart, with the engine arguments its users copy along."""
    prompts = ["Hello, my name is", "The capital of France is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=8)
    llm = LLM(model=smollm2_path, tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="auto",
              gpu_memory_utilization=0.9, max_model_len=256, swap_space=0.01, kv_cache_dtype="auto",
              tensor_parallel_size=1, trust_remote_code=True, enforce_eager=True, seed=0, n_threads=2)
    outputs = llm.generate(prompts, sampling_params, use_tqdm=False)
    for output in outputs:
        assert output.prompt in prompts and output.outputs[0].text and len(output.outputs[0].token_ids) == 8
    assert llm.stats()["host_blocks_total"] > 0   # swap_space made the host tier
    llm.close()


def test_engine_arguments_have_their_meaning(smollm2_path):
    with LLM(smollm2_path, n_ctx=128, n_threads=2, kv_mb=16, kv_cache_dtype="fp32") as f32, \
            LLM(smollm2_path, n_ctx=128, n_threads=2, kv_mb=16) as f16:
        # A float32 KV cache takes twice the bytes per block: half the blocks of the same pool.
        assert abs(f32.stats()["kv_blocks_total"] * 2 - f16.stats()["kv_blocks_total"]) <= 2
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8' is not a KV cache type"):
        LLM(smollm2_path, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="not both"):
        LLM(smollm2_path, kv_cache_dtype="fp16", type_k="q8_0")
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        LLM(smollm2_path, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="swap_space .* and kv_host_mb"):
        LLM(smollm2_path, swap_space=1, kv_host_mb=64)
    # The test model is Q4_1: any float dtype is its compute type's business, a wrong name is not.
    with pytest.raises(ValueError, match="dtype 'float8' is not one of"):
        LLM(smollm2_path, dtype="float8")
    with pytest.raises(ValueError, match="gpu_memory_utilization must be <= 1"):
        LLM(smollm2_path, gpu_memory_utilization=1.5)


def test_dtype_is_checked_against_an_unquantized_file():
    from ember.engine_args import check_dtype
    check_dtype("float16", 1)
    check_dtype("half", 1)
    check_dtype("bfloat16", 3)   # a quantized file: the kernels' own types
    with pytest.raises(ValueError, match="holds float32 weights"):
        check_dtype("bfloat16", 0)


def test_gpu_memory_utilization_sizes_the_pool_from_free_memory():
    gib = 1 << 30
    device = [CudaDevice(0, "test GPU", free_bytes=70 * gib, total_bytes=80 * gib)]
    # 0.9 of 80 GiB is 72 GiB; 10 GiB are in use, so 62 GiB are left, less the activations' margin.
    mb = kv_mb_for_utilization(0.9, n_gpu_blocks=30, n_layer=30, devices=lambda: device)
    assert mb == pytest.approx(62 * 1024 - GPU_HEADROOM_MB)
    # Half the blocks on the GPU: the other half's KV is in host memory, the pool is twice as large.
    assert kv_mb_for_utilization(0.9, 15, 30, devices=lambda: device) == pytest.approx(2 * mb)
    assert kv_mb_for_utilization(0.9, 0, 30, devices=lambda: device) == 0.0   # no GPU blocks
    assert kv_mb_for_utilization(0.9, 30, 30, devices=list) == 0.0      # no GPU
    with pytest.raises(ValueError, match="leaves no room for the KV cache"):
        kv_mb_for_utilization(0.1, 30, 30, devices=lambda: device)
    assert MIB == 1 << 20


def test_bad_arguments_leave_no_stray_traceback(smollm2_path):
    code = (f"from ember import LLM\n"
            f"for kw in (dict(bogus=1), dict(gpu_memory_utilization='x')):\n"
            f"    try:\n        LLM({smollm2_path!r}, **kw)\n    except (TypeError, ValueError) as e:\n"
            f"        print(type(e).__name__)\n"
            f"try:\n    LLM({smollm2_path!r}, 1, 2)\nexcept TypeError:\n    print('TypeError')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["TypeError", "ValueError", "TypeError"], r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_from_engine_args_and_awaitable_abort(smollm2_path):
    args = AsyncEngineArgs(model=smollm2_path, max_model_len=256, n_threads=2, max_num_seqs=2,
                           disable_log_stats=True)
    assert isinstance(args, EngineArgs)
    engine = AsyncLLMEngine.from_engine_args(args)
    try:
        assert engine.n_ctx == 256 and engine.max_num_seqs == 2

        async def run():
            stream = engine.generate("Once upon a time", SamplingParams(max_tokens=200, ignore_eos=True), "r1")
            first = await stream.__anext__()
            await engine.abort("r1")
            last = first
            async for out in stream:
                last = out
            engine.abort("unknown")   # not awaited: no warning, nothing happens
            return last
        last = asyncio.run(run())
        assert last.finished and last.outputs[0].finish_reason == "abort"
    finally:
        engine.shutdown()
    with pytest.raises(TypeError, match="engine_args"):
        AsyncLLMEngine.from_engine_args(42)


def test_prompt_logprobs_top_k(smollm2_path):
    """prompt_logprobs=k: each prompt token after the first with the k most likely tokens at its
    position (before, k was ignored and only the prompt token came)."""
    import numpy as np
    with LLM(smollm2_path, n_ctx=128, n_threads=2) as llm:
        [out] = llm.generate(["The capital of France is"], SamplingParams(max_tokens=1, prompt_logprobs=3),
                             use_tqdm=False)
        plps = out.prompt_logprobs
        assert plps[0] is None and len(plps) == len(out.prompt_token_ids)
        for token, entry in zip(out.prompt_token_ids[1:], plps[1:]):
            assert token in entry and 3 <= len(entry) <= 4
            ranked = sorted((lp.rank, lp.logprob) for t, lp in entry.items() if lp.rank <= 3)
            assert [r for r, _ in ranked][:3] == [1, 2, 3] and np.all(np.diff([v for _, v in ranked]) <= 0)
        [zero] = llm.generate(["The capital of France is"], SamplingParams(max_tokens=1, prompt_logprobs=0),
                              use_tqdm=False)
        assert all(len(e) == 1 for e in zero.prompt_logprobs[1:])
        assert [e[t].logprob for t, e in zip(zero.prompt_token_ids[1:], zero.prompt_logprobs[1:])] == \
            pytest.approx([e[t].logprob for t, e in zip(out.prompt_token_ids[1:], plps[1:])])
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
