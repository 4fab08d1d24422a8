"""The continuous-batching engine (_ember.Engine) against one sequence at a time: the same greedy
tokens for prompts run together (shared prefixes, chunked prefill, preemption), KV blocks all free
or cached afterwards, prefix caching, cancellation, perplexity, and bad requests."""
import math
import threading

import numpy as np
import pytest

from ember import _ember
from ember.perplexity import perplexity, perplexity_engine

from conftest import kernel_module

SYSTEM = ("The following is a conversation between a curious student and a patient teacher who explains "
          "things in plain words.\n\n")
QUESTIONS = [
    "What is the boiling point of water?", "Who wrote Hamlet?", "How do I boil an egg?",
    "What is a Python list?", "Why is the sky blue?", "When did World War II end?",
    "What is photosynthesis?", "How do I sort a list in Python?", "What is the speed of light?",
    "Who painted the Mona Lisa?", "What is a black hole?", "How do I make bread?",
    "What is recursion?", "What is the capital of Japan?", "How do magnets work?",
    "What is DNA?",
]


def device_layers(device):
    """n_gpu_layers for a test device, or a skip naming why there is no GPU."""
    if device == "cpu":
        return 0
    if "cuda" not in _ember.backends():
        pytest.skip(f"this ember was built without the CUDA backend (built in: {_ember.backends()})")
    try:
        kernel_module().Backend("cuda")
    except Exception as e:   # noqa: BLE001 - any failure to start a device means no GPU here
        pytest.skip(f"no CUDA device: {e}")
    return -1


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def model(request, smollm2_path):
    return _ember.Model(smollm2_path, n_gpu_layers=device_layers(request.param))


def prompts32(model):
    """32 prompts: 16 behind one shared prefix, and the same questions without it."""
    tok = model.tokenizer
    texts = [f"{SYSTEM}Student: {q}\nTeacher:" for q in QUESTIONS] + [f"Q: {q}\nA:" for q in QUESTIONS]
    return [tok.encode(t, True, False) for t in texts]


def greedy_alone(model, prompt, n):
    """Greedy tokens of one prompt through a Context (the Llama class's path), stopping at an
    end-of-generation token (not included) as the engine does."""
    ctx = _ember.Context(model, n_ctx=len(prompt) + n + 1, n_batch=64, n_threads=2)
    ctx.eval(prompt)
    out = []
    for _ in range(n):
        t = int(np.argmax(ctx.logits()))
        if model.tokenizer.is_eog(t):
            break
        out.append(t)
        ctx.eval([t])
    return out


def run_all(engine, prompts, **kw):
    """Submits every prompt and polls until all finish (outputs of other requests are dropped);
    returns per prompt a dict of its tokens, logprobs, top_logprobs, prompt_logprobs and final output."""
    ids = [engine.add_request(p, **kw) for p in prompts]
    got = {i: dict(tokens=[], logprobs=[], top=[], prompt_logprobs=[], out=None) for i in ids}
    left = set(ids)
    while left:
        for o in engine.poll(1.0):
            r = got.get(o.request_id)
            if r is None:
                continue
            r["tokens"] += o.token_ids
            r["logprobs"] += o.logprobs
            r["top"] += o.top_logprobs
            r["prompt_logprobs"] += o.prompt_logprobs
            if o.finished:
                r["out"] = o
                left.discard(o.request_id)
    return [got[i] for i in ids]


def finish_ok(r):
    assert r["out"].finish_reason in ("stop", "length"), r["out"].error
    return r["tokens"]


GREEDY = dict(temperature=0.0, max_tokens=20)


@pytest.mark.parametrize("deterministic", [True, False])
def test_batch_matches_one_at_a_time(model, deterministic):
    prompts = prompts32(model)
    # A small step budget: prompts are prefilled in chunks, mixed with other sequences' decodes.
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=32, max_num_batched_tokens=48, n_threads=2,
                           deterministic=deterministic)
    results = run_all(engine, prompts, **GREEDY)
    same = 0
    for p, r in zip(prompts, results):
        same += finish_ok(r) == greedy_alone(model, p, GREEDY["max_tokens"])
    stats = engine.stats()
    print(f"deterministic={deterministic}: {same}/{len(prompts)} prompts token-identical; {stats}")
    if deterministic:
        assert same == len(prompts)
    elif model.n_gpu_layers == 0 and kernel_module().simd_level() != "avx512":
        # Below AVX-512 the CPU's default mode runs steps of several sequences through the fast
        # batched matmul, whose sums differ from the single-token kernel (vec_dot) in the last
        # bits; on this small Q4_1 model that flips near-tied greedy choices on about a third of
        # the prompts. A wrong kernel would agree on almost none.
        assert same >= len(prompts) // 2
    else:
        # AVX-512: the model's types (Q4_1, Q8_0) have a single-token fast kernel, so every step
        # takes the same arithmetic whatever shares it.
        assert same >= math.ceil(0.95 * len(prompts))
    assert stats["cached_prompt_tokens"] > 0, "the shared system prefix should come from the prefix cache"
    assert stats["kv_blocks_used"] == 0
    free = stats["kv_blocks_total"] - stats["kv_blocks_used"] - stats["kv_blocks_cached"]
    assert stats["kv_blocks_cached"] + free == stats["kv_blocks_total"]
    engine.close()


def test_preemption_under_a_small_pool_keeps_outputs(model):
    prompts = prompts32(model)[:12]
    # 16 blocks of 16 tokens: one sequence of n_ctx 256, far fewer than 12 sequences need.
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=12, max_num_batched_tokens=64, n_threads=2,
                           kv_blocks=16, deterministic=True)
    results = run_all(engine, prompts, temperature=0.0, max_tokens=40)
    stats = engine.stats()
    print(stats)
    assert stats["preemptions"] > 0
    for p, r in zip(prompts, results):
        assert finish_ok(r) == greedy_alone(model, p, 40)
    assert stats["kv_blocks_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
    # The loop's time by phase: every step planned, ran a forward, sampled and handed out.
    phases = [stats[k] for k in ("seconds_schedule", "seconds_forward", "seconds_sample", "seconds_output")]
    assert all(t > 0 for t in phases), phases
    assert phases[1] > phases[0] and phases[1] > phases[2], "the forward should dominate a step"
    engine.close()


def test_stress_more_requests_than_blocks(model, rng):
    """Many sampled requests of random lengths through a pool that holds a few sequences; some
    cancelled along the way. Every request finishes and every block is free or cached."""
    engine = _ember.Engine(model, n_ctx=128, max_num_seqs=16, max_num_batched_tokens=96, n_threads=2, kv_blocks=24)
    ids = []
    for i in range(60):
        n = int(rng.integers(1, 90))
        prompt = rng.integers(0, model.n_vocab, n).tolist()
        ids.append(engine.add_request(prompt, temperature=1.0, seed=i, max_tokens=int(rng.integers(1, 128 - n))))
    for i in ids[::7]:
        engine.cancel(i)
    final = {}
    while len(final) < len(ids):
        for o in engine.poll(1.0):
            if o.finished:
                final[o.request_id] = o
    reasons = {o.finish_reason for o in final.values()}
    assert reasons <= {"stop", "length", "abort"}, [o.error for o in final.values()]
    stats = engine.stats()
    print(stats, reasons)
    assert stats["kv_blocks_used"] == 0
    engine.close()


def test_cancel_frees_blocks_within_a_step(model):
    engine = _ember.Engine(model, n_ctx=512, max_num_seqs=4, n_threads=2)
    rid = engine.add_request(model.tokenizer.encode(SYSTEM * 3, True, False), temperature=0.0, max_tokens=400,
                             ignore_eos=True)
    while not any(o.token_ids for o in engine.poll(1.0)):
        pass
    assert engine.stats()["kv_blocks_used"] > 0
    engine.cancel(rid)
    outs = []
    while not any(o.finished for o in outs):
        outs += engine.poll(1.0)
    assert outs[-1].finish_reason == "abort"
    assert engine.stats()["kv_blocks_used"] == 0
    engine.cancel(rid)    # finished: ignored
    engine.cancel(12345)  # unknown: ignored
    engine.close()


def test_prefix_cache_serves_the_shared_prefix(model):
    tok = model.tokenizer
    prefix = tok.encode(SYSTEM * 6, True, False)
    a, b = prefix + tok.encode(" Tell me about cats.", False, False), prefix + tok.encode(" And dogs?", False, False)
    engine = _ember.Engine(model, n_ctx=512, max_num_seqs=4, n_threads=2)
    ra, = run_all(engine, [a], **GREEDY)
    rb, = run_all(engine, [b], **GREEDY)
    bs = engine.kv_block_size
    assert ra["out"].num_cached_tokens == 0
    assert rb["out"].num_cached_tokens == len(prefix) // bs * bs
    assert finish_ok(rb) == greedy_alone(model, b, GREEDY["max_tokens"])
    off = _ember.Engine(model, n_ctx=512, max_num_seqs=4, n_threads=2, enable_prefix_caching=False)
    rb2, = run_all(off, [b], **GREEDY)
    assert rb2["out"].num_cached_tokens == 0 and finish_ok(rb2) == rb["tokens"]
    engine.close()
    off.close()


def test_seeded_sampling_independent_of_batch(model):
    tok = model.tokenizer
    p = tok.encode("Write a short poem about the sea.", True, False)
    kw = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=42, max_tokens=24)
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=16, n_threads=2, deterministic=True)
    alone, = run_all(engine, [p], **kw)
    ids = [engine.add_request(q, temperature=0.9, max_tokens=24) for q in prompts32(model)[:4]]
    together, = run_all(engine, [p], **kw)
    assert finish_ok(together) == finish_ok(alone)
    for i in ids:
        engine.cancel(i)
    engine.close()


def test_logprobs_match_the_logits(model):
    tok = model.tokenizer
    p = tok.encode("The capital of France is", True, False)
    engine = _ember.Engine(model, n_ctx=128, n_threads=2)
    r, = run_all(engine, [p], temperature=0.0, max_tokens=3, logprobs=3, prompt_logprobs=True)
    tokens = finish_ok(r)
    ctx = _ember.Context(model, n_ctx=128, n_threads=2)
    ctx.eval(p + tokens, logits_all=True)
    lg = ctx.all_logits().astype(np.float64)
    peak = lg.max(1, keepdims=True)
    lsm = lg - (peak + np.log(np.exp(lg - peak).sum(1, keepdims=True)))
    seq = p + tokens
    np.testing.assert_allclose(r["prompt_logprobs"], [lsm[i, seq[i + 1]] for i in range(len(p) - 1)], atol=2e-3)
    assert len(r["logprobs"]) == len(r["top"]) == len(tokens)
    for j, t in enumerate(tokens):
        row = lsm[len(p) - 1 + j]
        assert r["logprobs"][j] == pytest.approx(row[t], abs=2e-3)
        assert [i for i, _ in r["top"][j]] == list(np.argsort(-row, kind="stable")[:3])
    engine.close()


def test_perplexity_through_the_engine_equals_the_tool(smollm2_path):
    model = _ember.Model(smollm2_path)
    text = (" ".join([SYSTEM] + QUESTIONS) * 4).encode()
    want = perplexity(model, text, 128, 2, out=open("/dev/null", "w"))
    got = perplexity_engine(model, text, 128, 2)
    assert got == pytest.approx(want, rel=1e-5)


def test_threads_submit_while_another_polls(model):
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=8, n_threads=2)
    prompts = prompts32(model)[:8]
    ids, lock = [], threading.Lock()

    def submit(ps):
        for p in ps:
            rid = engine.add_request(p, temperature=0.0, max_tokens=8)
            with lock:
                ids.append(rid)

    workers = [threading.Thread(target=submit, args=(prompts[i::2],)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    final = set()
    while len(final) < len(prompts):
        final |= {o.request_id for o in engine.poll(1.0) if o.finished}
    assert final == set(ids)
    engine.close()


def test_close_aborts_pending_requests(model):
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=2, n_threads=2)
    ids = [engine.add_request(p, temperature=0.0, max_tokens=200, ignore_eos=True) for p in prompts32(model)[:6]]
    engine.close()
    outs = engine.poll(0)
    assert {o.request_id for o in outs if o.finished and o.finish_reason in ("abort", "length")} == set(ids)
    with pytest.raises(ValueError, match="closed"):
        engine.add_request([1, 2, 3])


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompt=[]), "prompt is empty"),
    (dict(prompt=[10 ** 7]), "out of range"),
    (dict(prompt=[1] * 300), "exceeds n_ctx"),
    (dict(prompt=[1, 2], top_p=0.0), "top_p"),
    (dict(prompt=[1, 2], temperature=float("inf")), "temperature"),
    (dict(prompt=[1, 2], logprobs=100), "logprobs"),
    (dict(prompt=[1, 2], max_tokens=-1), "max_tokens"),
    (dict(prompt=[1, 2], max_tokens=2, min_tokens=3), "min_tokens"),
    (dict(prompt=[1, 2], stop_token_ids=[-5]), "stop_token_ids"),
    (dict(prompt=[1, 2], logit_bias=[(10 ** 7, 1.0)]), r"logit_bias: token id 10000000 is out of range"),
    (dict(prompt=[1, 2], logit_bias=[(-1, 1.0)]), "logit_bias"),
])
def test_bad_requests_name_the_problem(smollm2_path, kwargs, match):
    engine = _ember.Engine(_ember.Model(smollm2_path), n_ctx=256, n_threads=2)
    prompt = kwargs.pop("prompt")
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, **kwargs)
    # nothing already accepted is lost
    finish_ok(run_all(engine, [[1, 2, 3]], temperature=0.0, max_tokens=2)[0])
    engine.close()


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_ctx=0), "n_ctx"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(kv_blocks=3), r"cannot hold one sequence of n_ctx 256 tokens, which needs 16 blocks \(.* MiB\)"),
    (dict(kv_mb=0.01), "cannot hold one sequence"),
    (dict(kv_mb=-1.0), "kv_mb"),
    (dict(type_k="q6_k"), "type_k"),
])
def test_bad_engine_parameters(smollm2_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _ember.Engine(_ember.Model(smollm2_path), **{"n_ctx": 256, **kwargs})


def test_stop_token_ids_end_the_text_and_are_named(model):
    """A stop_token_ids entry ends the sequence before it (not among the tokens) and the final
    output names it; a sequence that ends otherwise names none."""
    prompt = prompts32(model)[1]
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=2, n_threads=2)
    (full,) = run_all(engine, [prompt], temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = finish_ok(full)
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    (cut,) = run_all(engine, [prompt], temperature=0.0, max_tokens=16, ignore_eos=True,
                     stop_token_ids=[tokens[k]])
    assert cut["out"].finish_reason == "stop" and cut["tokens"] == tokens[:k] and cut["out"].stop_token_id == tokens[k]
    (length,) = run_all(engine, [prompt], temperature=0.0, max_tokens=2, ignore_eos=True)
    assert length["out"].finish_reason == "length" and length["out"].stop_token_id == -1
    engine.close()


def test_min_tokens_bans_end_of_generation_unless_ignore_eos(model):
    """min_tokens keeps the end-of-generation token out of the first tokens (greedy with a bias
    that makes it the top one: those steps sample on the host), but with ignore_eos there is
    nothing to ban (vLLM's rule): the token is drawn and generation goes on (greedy steps take the
    runner's argmax where the logits lie)."""
    eos = model.tokenizer.eos
    prompt = prompts32(model)[0]
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=2, n_threads=2)
    bias = [(eos, 100.0)]
    (banned,) = run_all(engine, [prompt], temperature=0.0, max_tokens=8, min_tokens=3, logit_bias=bias)
    assert banned["out"].finish_reason == "stop" and len(banned["tokens"]) == 3 and eos not in banned["tokens"]
    assert banned["out"].stop_token_id == -1   # an end-of-generation token, not a stop_token_ids entry
    (drawn,) = run_all(engine, [prompt], temperature=0.0, max_tokens=4, min_tokens=4, logit_bias=bias, ignore_eos=True)
    assert drawn["out"].finish_reason == "length" and drawn["tokens"] == [eos] * 4
    # Plain greedy with ignore_eos: every step takes argmax_rows; the same tokens as one at a time.
    (plain,) = run_all(engine, [prompt], temperature=0.0, max_tokens=12, min_tokens=12, ignore_eos=True)
    alone = greedy_alone(model, prompt, 12)
    assert plain["tokens"][:len(alone)] == alone
    engine.close()
