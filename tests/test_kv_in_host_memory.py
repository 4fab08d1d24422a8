"""KV in host memory (offload_kqv=False, -nkvo): the KV of GPU blocks in host memory
(src/model/kv_in_host_memory.h), staged on the GPU for the ops that touch it, with a GPU cache of
its blocks (kv_gpu_cache_mb). Logits equal the GPU-KV ones bit for bit across chunked prefill and
decode, for f16 and q8_0 KV, with no cache, one that holds some of the blocks and one that holds
all; perplexity within 0.1%; Llama, the engine and partial offload run with it; the engine's host
tier copies blocks in and out of it (swaps, evicted prefix blocks served again) with the GPU-KV
engine's tokens. The model tests need a GPU and are skipped with the reason without one; the
flags' plumbing is checked everywhere."""
import io

import numpy as np
import pytest

from conftest import REFERENCE, kernel_module
from ember import LLM, SamplingParams, _ember
from ember.llama import Llama
from ember.perplexity import perplexity
from test_engine import QUESTIONS, SYSTEM, finish_ok, run_all
from test_engine_host_tier import block_mib

E = kernel_module()


def need_gpu():
    if "cuda" not in E.backend_names():
        pytest.skip(f"this ember was built without the CUDA backend (built in: {E.backend_names()})")
    try:
        E.Backend("cuda")
    except ValueError as e:
        pytest.skip(f"no CUDA device: {e}")


@pytest.fixture(scope="module")
def gpu_model(smollm2_path):
    need_gpu()
    return _ember.Model(smollm2_path, n_gpu_layers=-1)


def run(model, tokens, offload_kqv, kv_type, n_decode=12, cache_mb=0):
    """Logits of a chunked prompt (every row) and then of n_decode single-token steps."""
    ctx = _ember.Context(model, n_ctx=256, n_batch=24, n_threads=2, offload_kqv=offload_kqv, type_k=kv_type,
                         type_v=kv_type, kv_gpu_cache_mb=cache_mb)
    ctx.eval(tokens, logits_all=True)
    rows = [ctx.all_logits()]
    for _ in range(n_decode):
        nxt = int(np.argmax(rows[-1][-1]))
        ctx.eval([nxt])
        rows.append(ctx.logits()[None, :])
    return np.concatenate(rows)


# SmolLM2's block of 16 tokens takes 360 KiB of f16 KV over its 30 layers: a 1 MiB cache holds 2
# of the test's 7 blocks, 64 MiB all of them.
@pytest.mark.parametrize("cache_mb", [0, 1, 64])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_kv_in_host_memory_logits_equal_gpu_kv(gpu_model, kv_type, cache_mb, rng):
    tokens = rng.integers(0, gpu_model.n_vocab, 90).tolist()
    np.testing.assert_array_equal(run(gpu_model, tokens, False, kv_type, cache_mb=cache_mb),
                                  run(gpu_model, tokens, True, kv_type))


def test_engine_outputs_unchanged_by_kv_in_host_memory_and_a_small_cache(smollm2_path):
    """Prompts behind one prefix (shared blocks) and a GPU cache of 2 blocks a layer.
    Deterministic mode, so both runs schedule alike."""
    need_gpu()
    prefix = "A conversation between a student and a teacher who answers in plain words. "
    prompts = [prefix + q for q in ("Why is the sky blue?", "What is DNA?", "Who wrote Hamlet?",
                                    "How do magnets work?", "What is a black hole?", "What is recursion?")]
    params = SamplingParams(temperature=0, max_tokens=40)
    texts = {}
    for offload in (True, False):
        llm = LLM(smollm2_path, n_ctx=256, n_gpu_layers=-1, max_num_seqs=6, kv_mb=8, kv_host_mb=16,
                  deterministic=True, offload_kqv=offload, kv_gpu_cache_mb=1)
        try:
            texts[offload] = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
        finally:
            llm.close()
    assert texts[False] == texts[True]


def host_tier_workload(model, **engine_kw):
    """Greedy tokens and stats of an engine whose pool of 32 blocks is far too small: 8 sequences
    growing to about 135 tokens each are preempted and swapped to the host tier and back; then a
    long prefix, evicted from the pool by other traffic, is served again from the tier."""
    tok = model.tokenizer
    growing = [tok.encode(f"{SYSTEM}Student: {q}\nTeacher:", True, False) for q in QUESTIONS[:8]]
    prefix = tok.encode(SYSTEM * 6, True, False)
    a, b = (prefix + tok.encode(q, False, False) for q in (" Tell me about cats.", " And dogs?"))
    others = [tok.encode(f"{q} " * 24, True, False)[:200] for q in QUESTIONS[8:12]]
    e = _ember.Engine(model, n_ctx=512, n_threads=2, deterministic=True, kv_block_size=16, max_num_seqs=8,
                      max_num_batched_tokens=64, kv_blocks=32, kv_host_mb=96 * block_mib(model), **engine_kw)
    try:
        tokens = [finish_ok(r) for r in run_all(e, growing, temperature=0.0, max_tokens=100, ignore_eos=True)]
        for batch in ([a], others, [b]):
            tokens += [finish_ok(r) for r in run_all(e, batch, temperature=0.0, max_tokens=8)]
        return tokens, e.stats()
    finally:
        e.close()


def test_host_tier_copies_in_and_out_of_kv_in_host_memory(smollm2_path):
    """The host tier's copies are the copies the KV in host memory takes from outside (host to
    host, after the GPU's copies in flight), and each must drop the GPU cache's copies of the
    blocks it writes: with a cache of 2 blocks a layer, a stale cached block would change the
    tokens against the GPU-KV engine's (same schedule: deterministic mode, fixed lengths)."""
    need_gpu()
    model = _ember.Model(smollm2_path, n_gpu_layers=-1)
    want, _ = host_tier_workload(model)
    got, s = host_tier_workload(model, offload_kqv=False, kv_gpu_cache_mb=1)
    print(s)
    assert s["swaps_out"] > 0 and s["swaps_in"] == s["swaps_out"] and s["host_cache_hits"] > 0
    assert got == want


def test_kv_in_host_memory_perplexity_within_a_tenth_of_a_percent(gpu_model):
    text = (REFERENCE / "apache-2.0.txt").read_bytes()
    # Steps of 2 tokens: the staging copies of decode-sized steps, as generation makes them.
    host = perplexity(gpu_model, text, 128, 2, 2, out=io.StringIO(), offload_kqv=False)
    dev = perplexity(gpu_model, text, 128, 2, 2, out=io.StringIO())
    print(f"PPL KV in host memory {host:.4f}, GPU KV {dev:.4f}")
    assert abs(host / dev - 1) < 1e-3


def test_llama_engine_and_partial_offload_with_kv_in_host_memory(smollm2_path):
    need_gpu()
    prompt = "The capital of France is"
    texts = {}
    for ngl in (-1, 12):   # (12: the other blocks on the CPU, whose KV is host memory anyway)
        for offload in (True, False):
            with Llama(smollm2_path, n_ctx=256, n_gpu_layers=ngl, offload_kqv=offload, verbose=False) as llm:
                texts[ngl, offload] = llm(prompt, max_tokens=16, temperature=0)["choices"][0]["text"]
        assert texts[ngl, False] == texts[ngl, True], f"n_gpu_layers={ngl}"
    want = texts[-1, True]
    llm = LLM(smollm2_path, n_ctx=256, n_gpu_layers=-1, offload_kqv=False, max_num_seqs=4)
    try:
        outs = llm.generate([prompt] * 3, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
        assert [o.outputs[0].text for o in outs] == [want] * 3
    finally:
        llm.close()


def test_offload_kqv_false_on_cpu_blocks_changes_nothing(smollm2_path, rng):
    """With no GPU block the KV is in host memory anyway: the flag is accepted and a no-op."""
    model = _ember.Model(smollm2_path)
    tokens = rng.integers(0, model.n_vocab, 20).tolist()
    a = _ember.Context(model, n_ctx=64, n_threads=2)
    b = _ember.Context(model, n_ctx=64, n_threads=2, offload_kqv=False)
    a.eval(tokens)
    b.eval(tokens)
    np.testing.assert_array_equal(a.logits(), b.logits())
    with pytest.raises(ValueError, match="kv_gpu_cache_mb must be >= 0, got -1"):
        _ember.Context(model, n_ctx=64, offload_kqv=False, kv_gpu_cache_mb=-1)


def test_tools_take_nkvo():
    from ember.server.args import engine_kwargs, parse_args
    from ember import bench, cli
    assert engine_kwargs(parse_args(["-m", "x.gguf", "-nkvo"]))["offload_kqv"] is False
    assert engine_kwargs(parse_args(["-m", "x.gguf"]))["offload_kqv"] is True
    kw = engine_kwargs(parse_args(["-m", "x.gguf", "--kv-mb", "512", "--kv-host-mb", "1024", "-b", "256"]))
    assert (kw["kv_mb"], kw["kv_host_mb"], kw["max_num_batched_tokens"]) == (512, 1024, 256)
    for bad in (["--kv-mb", "-1"], ["--kv-host-mb", "-5"], ["-b", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["-m", "x.gguf", *bad])
    assert cli._parser().parse_args(["-m", "x", "-p", "y", "--no-kv-offload"]).offload_kqv is False
    assert engine_kwargs(parse_args(["-m", "x.gguf", "-nkvo", "--kv-gpu-cache-mb", "0"]))["kv_gpu_cache_mb"] == 0
    assert engine_kwargs(parse_args(["-m", "x.gguf"]))["kv_gpu_cache_mb"] == _ember.ContextParams().kv_gpu_cache_mb
    with pytest.raises(SystemExit):
        bench.main(["-m", "x.gguf", "-nkvo", "2"])
    for bad in ("-1", "1.5", "lots"):
        with pytest.raises(SystemExit):
            parse_args(["-m", "x.gguf", "-nkvo", "--kv-gpu-cache-mb", bad])
