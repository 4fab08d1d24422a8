"""offload_kqv=False (-nkvo): the KV of GPU blocks in host memory (src/model/host_kv.h), staged on
the GPU for the ops that touch it. Logits equal the GPU-KV ones bit for bit across chunked prefill
and decode, for f16 and q8_0 KV; perplexity within 0.1%; Llama, the engine and partial offload run
with it. The model tests need a
GPU and are skipped with the reason without one; the flag's plumbing is checked everywhere."""
import io

import numpy as np
import pytest

from conftest import REFERENCE, kernel_module
from ember import LLM, SamplingParams, _ember
from ember.llama import Llama
from ember.perplexity import perplexity

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


def run(model, tokens, offload_kqv, kv_type, n_decode=12):
    """Logits of a chunked prompt (every row) and then of n_decode single-token steps."""
    ctx = _ember.Context(model, n_ctx=256, n_batch=24, n_threads=2, offload_kqv=offload_kqv, kv_type=kv_type)
    ctx.eval(tokens, logits_all=True)
    rows = [ctx.all_logits()]
    for _ in range(n_decode):
        nxt = int(np.argmax(rows[-1][-1]))
        ctx.eval([nxt])
        rows.append(ctx.logits()[None, :])
    return np.concatenate(rows)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_host_kv_logits_equal_gpu_kv(gpu_model, kv_type, rng):
    tokens = rng.integers(0, gpu_model.n_vocab, 90).tolist()
    np.testing.assert_array_equal(run(gpu_model, tokens, False, kv_type), run(gpu_model, tokens, True, kv_type))


def test_host_kv_perplexity_within_a_tenth_of_a_percent(gpu_model):
    text = (REFERENCE / "apache-2.0.txt").read_bytes()
    # Steps of 2 tokens: the staging copies of decode-sized steps, as generation makes them.
    host = perplexity(gpu_model, text, 128, 2, 2, out=io.StringIO(), offload_kqv=False)
    dev = perplexity(gpu_model, text, 128, 2, 2, out=io.StringIO())
    print(f"PPL host KV {host:.4f}, GPU KV {dev:.4f}")
    assert abs(host / dev - 1) < 1e-3


def test_llama_engine_and_partial_offload_with_host_kv(smollm2_path):
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
    assert cli._parser().parse_args(["-m", "x", "-p", "y", "--no-kv-offload"]).no_kv_offload
    with pytest.raises(SystemExit):
        bench.main(["-m", "x.gguf", "-nkvo", "2"])
