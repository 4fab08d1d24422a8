"""The engine's host tier (kv_host_mb): sequences preempted under a small KV pool are swapped out
to host memory and back with the same greedy tokens as a run that never preempts; prefix blocks
the device cache evicts come back from the host; a workload of three times the pool completes
with every block and host slot free or cached afterwards; a swapped request can be cancelled;
bad sizes are named. Deterministic mode throughout: a request's tokens then do not depend on
what else runs beside it, so any difference is the swap's."""
import time

import pytest

from ember import LLM, _ember
from test_engine import SYSTEM, QUESTIONS, finish_ok, model, prompts32, run_all   # noqa: F401 (model: fixture)

BS = 16


def block_mib(m):
    """MiB of one f16 KV block of BS tokens over every layer (K and V)."""
    return m.n_layer * 2 * BS * m.n_head_kv * m.head_dim * 2 / 2**20


def engine(m, **kw):
    return _ember.Engine(m, n_threads=2, deterministic=True, kv_block_size=BS, **kw)


def reference(m, prompts, n_ctx, **req):
    """Tokens of each prompt from an engine whose pool holds every sequence at once."""
    e = engine(m, n_ctx=n_ctx, max_num_seqs=len(prompts))
    out = [finish_ok(r) for r in run_all(e, prompts, **req)]
    assert e.stats()["preemptions"] == 0
    e.close()
    return out


def assert_all_free(s):
    """After every request finished: no device block or host slot in use, the rest cached or free."""
    assert (s["running"], s["waiting"], s["swapped"]) == (0, 0, 0)
    assert s["kv_blocks_used"] == 0 and s["host_blocks_used"] == 0
    assert s["kv_blocks_cached"] <= s["kv_blocks_total"] and s["host_blocks_cached"] <= s["host_blocks_total"]


@pytest.mark.parametrize("host_blocks", [64, 8])
def test_swapped_sequences_keep_greedy_outputs(model, host_blocks):
    """8 sequences growing to about 135 tokens in a pool of 16 blocks (256 tokens): with a tier of
    64 blocks every preemption is a swap; with 8, those that do not fit are recomputed (and find
    their prefix on the host). Either way the tokens are the unconstrained run's."""
    prompts = prompts32(model)[:8]
    req = dict(temperature=0.0, max_tokens=100, ignore_eos=True)
    want = reference(model, prompts, 256, **req)
    e = engine(model, n_ctx=256, max_num_seqs=8, max_num_batched_tokens=64, kv_blocks=16,
               kv_host_mb=host_blocks * block_mib(model))
    got = [finish_ok(r) for r in run_all(e, prompts, **req)]
    s = e.stats()
    print(s)
    assert got == want
    assert s["host_blocks_total"] == host_blocks
    assert s["swaps_out"] > 0 and s["swaps_in"] == s["swaps_out"]
    if host_blocks == 64:
        assert s["preemptions"] == s["swaps_out"], "the tier has room: no recompute"
    else:
        assert s["preemptions"] > s["swaps_out"], "a full tier falls back to recompute"
    assert_all_free(s)
    e.close()


def test_evicted_prefix_comes_back_from_the_host(model):
    tok = model.tokenizer
    prefix = tok.encode(SYSTEM * 6, True, False)
    a, b = (prefix + tok.encode(q, False, False) for q in (" Tell me about cats.", " And dogs?"))
    # Other traffic, as long as the pool, evicts every cached block of the prefix.
    others = [tok.encode(f"{q} " * 24, True, False)[:200] for q in QUESTIONS[:4]]
    req = dict(temperature=0.0, max_tokens=8)
    e = engine(model, n_ctx=512, max_num_seqs=4, kv_blocks=32, kv_host_mb=64 * block_mib(model))
    run_all(e, [a], **req)
    run_all(e, others, **req)
    s = e.stats()
    assert s["host_blocks_cached"] >= len(prefix) // BS and s["host_cache_hits"] == 0
    rb, = run_all(e, [b], **req)
    s = e.stats()
    print(s)
    assert rb["out"].num_cached_tokens == len(prefix) // BS * BS
    assert s["host_cache_hits"] > 0
    assert s["host_cache_hits"] + s["prefix_cache_hits"] >= len(prefix) // BS
    assert finish_ok(rb) == reference(model, [b], 512, **req)[0]
    assert_all_free(s)
    e.close()


def test_three_times_the_pool_with_shared_prefixes_completes(model):
    """24 requests behind three system prompts, their KV together over three times the pool; the
    tier holds about half of it. Every request ends with the unconstrained run's tokens."""
    tok = model.tokenizer
    systems = [SYSTEM, "You are a terse assistant. Answer in one short sentence, then stop.\n\n",
               "Below is a question from a quiz about science and history. Give the answer first.\n\n"]
    prompts = [tok.encode(f"{systems[i % 3] * 2}Q: {QUESTIONS[i % 16]}\nA:", True, False) for i in range(24)]
    req = dict(temperature=0.0, max_tokens=32, ignore_eos=True)
    total = sum(-(-(len(p) + 32) // BS) for p in prompts)
    pool = 40
    assert total >= 3 * pool, f"{total} blocks of KV for a pool of {pool}"
    want = reference(model, prompts, 256, **req)
    e = engine(model, n_ctx=256, max_num_seqs=24, max_num_batched_tokens=128, kv_blocks=pool,
               kv_host_mb=(total // 2) * block_mib(model))
    got = [finish_ok(r) for r in run_all(e, prompts, **req)]
    s = e.stats()
    print(f"{total} blocks for {pool}: {s}")
    assert got == want
    assert s["swaps_out"] > 0 and s["swaps_in"] == s["swaps_out"]
    assert s["cached_prompt_tokens"] > 0
    assert_all_free(s)
    e.close()


def test_cancel_a_swapped_request(model):
    tok = model.tokenizer
    prompts = [tok.encode(SYSTEM * 4, True, False), tok.encode(f"Q: {QUESTIONS[0]} " * 6, True, False)]
    # Two sequences growing to n_ctx in a pool of one: the second is swapped out and waits there.
    e = engine(model, n_ctx=256, max_num_seqs=2, kv_blocks=16, kv_host_mb=32 * block_mib(model))
    first, second = (e.add_request(p, temperature=0.0, max_tokens=250, ignore_eos=True) for p in prompts)
    deadline = time.monotonic() + 60
    while e.stats()["swapped"] == 0:
        assert time.monotonic() < deadline, "no sequence was swapped out"
        e.poll(0.01)
    assert e.stats()["host_blocks_used"] > 0
    e.cancel(second)
    final = {}
    while len(final) < 2:
        final.update({o.request_id: o for o in e.poll(1.0) if o.finished})
    assert final[second].finish_reason == "abort" and final[first].finish_reason == "length"
    s = e.stats()
    print(s)
    assert s["swaps_out"] >= 1 and s["swaps_in"] == s["swaps_out"] - 1
    assert_all_free(s)
    e.close()


def test_host_tier_size_from_kv_host_mb(smollm2_path):
    m = _ember.Model(smollm2_path)
    mib = 10.5 * block_mib(m)
    e = engine(m, n_ctx=128, kv_host_mb=mib)
    same = engine(m, n_ctx=128, kv_mb=mib)
    assert e.stats()["host_blocks_total"] == same.stats()["kv_blocks_total"] == 10
    assert engine(m, n_ctx=256).stats()["host_blocks_total"] == 0
    e.close()
    same.close()


@pytest.mark.parametrize("kv_host_mb, match", [
    (-1.0, r"kv_host_mb must be a finite number >= 0 \(0: no host tier\), got -1"),
    (float("nan"), "kv_host_mb must be a finite number"),
    (float("inf"), "kv_host_mb must be a finite number"),
    (0.01, r"kv_host_mb 0.01 MiB holds no KV block, which takes 0.35\d* MiB"),
])
def test_bad_kv_host_mb(smollm2_path, kv_host_mb, match):
    with pytest.raises(ValueError, match=match):
        _ember.Engine(_ember.Model(smollm2_path), n_ctx=256, kv_host_mb=kv_host_mb)


def test_llm_passes_kv_host_mb(smollm2_path):
    with pytest.raises(ValueError, match="kv_host_mb"):
        LLM(smollm2_path, n_ctx=256, kv_host_mb=-2)
    with LLM(smollm2_path, n_ctx=256, max_num_seqs=4, n_threads=2, kv_mb=6, kv_host_mb=16,
             deterministic=True) as llm:
        outs = llm.generate(["The capital of France is", "def fibonacci(n):"], use_tqdm=False)
        assert all(o.outputs[0].text for o in outs)
        s = llm.stats()
        assert s["host_blocks_total"] > 0 and s["host_blocks_used"] == 0
        assert {"swaps_out", "swaps_in", "host_blocks_cached", "host_cache_hits"} <= set(s)
