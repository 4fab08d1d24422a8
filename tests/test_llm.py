"""ember.LLM (vLLM's offline API over the C++ continuous-batching engine) and SamplingParams on the
real SmolLM2-135M model: batched greedy output equals Llama's one prompt at a time, stop strings
and stop tokens, n > 1, seeds independent of batch composition, logprobs, prompt logprobs,
prefix caching, context limits and interrupts. The SamplingParams tests need no engine; the rest
fail (never skip) while _ember.Engine is missing."""
import _thread
import json
import math
import pickle
import threading
import time

import numpy as np
import pytest

from ember import LLM, CompletionOutput, Llama, Logprob, RequestOutput, SamplingParams, _ember
from ember.sampling_params import RANDOM_SEED
from test_engine import greedy_alone   # Llama's path: one Context, argmax, stopping before EOS

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "The three primary colors are",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]   # ends with EOS: "stop"
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    # deterministic: each request's logits do not depend on what else is in the batch.
    with LLM(smollm2_path, n_ctx=512, max_num_seqs=8, deterministic=True) as model:
        yield model


@pytest.fixture(scope="module")
def llama(smollm2_path):
    with Llama(smollm2_path, n_ctx=512, verbose=False) as model:
        yield model


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def idle(llm):
    s = llm.stats()
    return s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0


# ---- SamplingParams (no engine needed) ------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens"), (dict(min_tokens=-1), "min_tokens"),
    (dict(n=0), "n"), (dict(top_k=-2), "top_k"), (dict(min_p=1.5), "min_p"), (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=21), "logprobs"),
    (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(seed=-1), "seed"), (dict(seed=RANDOM_SEED - 1, n=2), "seed"),
    (dict(stop=""), "stop"), (dict(stop=["ok", ""]), "stop"),
])
def test_sampling_params_validation(kwargs, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature="0.5"), "temperature"), (dict(max_tokens=2.5), "max_tokens"), (dict(n=True), "n"),
    (dict(top_k=None), "top_k"), (dict(stop=5), "stop"), (dict(stop=["ok", 5]), "stop"),
    (dict(stop_token_ids=["2"]), "stop_token_ids"), (dict(stop_token_ids=7), "stop_token_ids"),
    (dict(logit_bias={"7": 1.0}), "logit_bias"), (dict(logit_bias=[(7, 1.0)]), "logit_bias"),
    (dict(seed="1"), "seed"), (dict(ignore_eos=1), "ignore_eos"),
])
def test_sampling_params_types(kwargs, name):
    with pytest.raises(TypeError, match=rf"SamplingParams: {name} must be"):
        SamplingParams(**kwargs)
    # numpy's scalars are numbers too.
    assert SamplingParams(max_tokens=np.int64(3), temperature=np.float32(0.5)).max_tokens == 3


def test_sampling_params_to_engine_kwargs():
    kw = SamplingParams(temperature=0.0, max_tokens=None).engine_kwargs(0, 100)
    assert kw["temperature"] == 0.0 and kw["top_k"] == 0 and kw["seed"] == RANDOM_SEED
    assert kw["max_tokens"] == 100 and kw["logprobs"] == -1 and kw["prompt_logprobs"] is False
    p = SamplingParams(n=3, top_k=20, seed=10, stop="x", stop_token_ids=[5], logprobs=2, prompt_logprobs=0,
                       repetition_penalty=1.1, logit_bias={7: -1.5})
    assert p.stop == ["x"] and p.stop_token_ids == [5]
    kws = [p.engine_kwargs(i, 16) for i in range(3)]
    assert [k["seed"] for k in kws] == [10, 11, 12]
    assert [k["prompt_logprobs"] for k in kws] == [True, False, False]   # the n share one prompt
    assert kws[0]["top_k"] == 20 and kws[0]["repeat_penalty"] == 1.1 and kws[0]["logit_bias"] == [(7, -1.5)]
    assert kws[0]["logprobs"] == 2 and kws[0]["stop_token_ids"] == [5]
    assert SamplingParams(top_k=0).engine_kwargs(0, 1)["top_k"] == 0


# ---- LLM on the engine -----------------------------------------------------------------------
def test_engine_binding_exists():
    assert hasattr(_ember, "Engine"), "_ember.Engine is not built: LLM and AsyncLLMEngine need it"


def test_generate_returns_outputs_in_prompt_order(llm, llama):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == PROMPTS
    assert len({o.request_id for o in outs}) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        assert isinstance(out, RequestOutput) and out.finished
        assert out.prompt_token_ids == llama.tokenize(prompt.encode(), special=True)
        (c,) = out.outputs
        assert isinstance(c, CompletionOutput) and c.index == 0 and c.token_ids and c.text
        assert c.logprobs is None and c.cumulative_logprob is None and out.prompt_logprobs is None
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 4 + ["stop"]
    assert len(outs[0].outputs[0].token_ids) == 24
    assert outs[4].outputs[0].stop_reason is None and "<|im_end|>" not in outs[4].outputs[0].text


def test_batched_greedy_equals_llama_alone(llm, llama):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == greedy_alone(llama._model, out.prompt_token_ids, 24), prompt
        alone = llama.create_completion(prompt, temperature=0.0, max_tokens=24)["choices"][0]
        assert out.outputs[0].text == alone["text"] and out.outputs[0].finish_reason == alone["finish_reason"]


def test_prompt_forms(llm, llama):
    ids = llama.tokenize(PROMPTS[0].encode(), special=True)
    want = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    outs = llm.generate([ids, {"prompt_token_ids": ids}, {"prompt": PROMPTS[0]}], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [want] * 3
    assert [o.prompt for o in outs] == [None, None, PROMPTS[0]]
    assert llm.generate(ids, GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want   # one token-id prompt
    # One SamplingParams per prompt.
    a, b = llm.generate(PROMPTS[:2], [SamplingParams(temperature=0, max_tokens=3), GREEDY], use_tqdm=False)
    assert len(a.outputs[0].token_ids) == 3 and len(b.outputs[0].token_ids) == 24
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(PROMPTS[:2], [GREEDY], use_tqdm=False)


def test_stop_strings_truncate(llm):
    full = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0]
    stop = full.text[10:14]
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop=[stop, "never-appears"]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == full.text[:full.text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    # The tokens up to the one that completed the stop string, as the full run made them.
    assert 0 < len(out.token_ids) < len(full.token_ids) and out.token_ids == full.token_ids[:len(out.token_ids)]
    wait_until(lambda: idle(llm))   # the engine request was cancelled
    kept = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, stop=[stop],
                                                   include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert kept.text == out.text + stop and kept.finish_reason == "stop" and kept.token_ids == out.token_ids


def test_stop_token_ids(llm, llama):
    full = llm.generate(PROMPTS[1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i])
    out = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[full[k]]),
                       use_tqdm=False)[0].outputs[0]
    # The stop token is neither in the text nor (unlike vLLM) in token_ids, as in Llama; stop_reason
    # names it, as vLLM's does.
    assert out.finish_reason == "stop" and out.stop_reason == full[k] and out.token_ids == full[:k]
    assert out.text == llama.create_completion(PROMPTS[1], temperature=0, max_tokens=k)["choices"][0]["text"]


def test_n_sequences_with_seeds(llm):
    params = dict(temperature=1.0, top_k=0, top_p=1.0, max_tokens=10)
    (out,) = llm.generate(PROMPTS[2], SamplingParams(n=2, seed=7, **params), use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1] and out.finished
    one = [llm.generate(PROMPTS[2], SamplingParams(seed=s, **params), use_tqdm=False)[0].outputs[0]
           for s in (7, 8)]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in one]


def test_seeded_sampling_independent_of_batch(llm):
    params = SamplingParams(temperature=1.2, top_k=0, top_p=1.0, max_tokens=16, seed=1234)
    alone = [llm.generate(PROMPTS[3], params, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2)]
    assert alone[0] == alone[1]
    others = [SamplingParams(temperature=1.0, max_tokens=20, seed=s) for s in (1, 2, 3)]
    batch = llm.generate(PROMPTS[:3] + [PROMPTS[3]], others + [params], use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone[0]
    other_seed = llm.generate(PROMPTS[3], SamplingParams(temperature=1.2, top_k=0, top_p=1.0, max_tokens=16,
                                                         seed=99), use_tqdm=False)[0].outputs[0].token_ids
    assert other_seed != alone[0]


def test_llm_seed_makes_unseeded_requests_reproducible(smollm2_path):
    params = SamplingParams(temperature=1.0, max_tokens=8)
    runs = []
    for _ in range(2):
        with LLM(smollm2_path, n_ctx=128, max_num_seqs=4, deterministic=True, seed=5) as model:
            runs.append([o.outputs[0].token_ids for o in model.generate(PROMPTS[:3], params, use_tqdm=False)])
    assert runs[0] == runs[1]


def test_logprobs(llm, llama):
    (out,) = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=6, logprobs=3), use_tqdm=False)
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 6
    for token, entry in zip(c.token_ids, c.logprobs):
        assert token in entry and 1 <= len(entry) <= 4 and all(v <= 0.0 for v in entry.values())
        assert math.isclose(entry[token], max(entry.values()))   # greedy: the most likely token
    assert math.isclose(c.cumulative_logprob, sum(e[t] for t, e in zip(c.token_ids, c.logprobs)), abs_tol=1e-6)
    llama.reset()
    llama.eval(out.prompt_token_ids)
    logits = llama._ctx.logits().astype(np.float64)
    top_logprob = -np.log(np.exp(logits - logits.max()).sum())   # log-softmax of the largest logit
    assert math.isclose(c.logprobs[0][c.token_ids[0]], top_logprob, abs_tol=1e-3)
    (only,) = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=6, logprobs=0), use_tqdm=False)
    assert [list(e) for e in only.outputs[0].logprobs] == [[t] for t in c.token_ids]


def test_logprobs_are_vllm_logprob_objects(llm, llama):
    """vLLM code reads entry[token].logprob / .rank / .decoded_token; older ember code read floats."""
    params = SamplingParams(temperature=1.5, top_k=0, max_tokens=12, logprobs=5, prompt_logprobs=1, seed=11)
    (out,) = llm.generate(PROMPTS[3], params, use_tqdm=False)
    c = out.outputs[0]
    for token, entry in zip(c.token_ids, c.logprobs):
        for t, lp in entry.items():
            assert isinstance(lp, Logprob) and lp.logprob == float(lp) and math.isclose(lp + 0.0, lp.logprob)
            assert lp.decoded_token == bytes(llama._tok.token_to_piece(t)).decode("utf-8", "replace")
            # The top 5 hold every token more likely than one of them; a sampled token outside
            # them (a sixth entry) ranks below them.
            if t != token or len(entry) <= 5:
                assert lp.rank == 1 + sum(v > lp for v in entry.values())
            else:
                assert lp.rank > 5
    # At temperature 1.5 over the whole vocabulary some draw is not the most likely token.
    assert any(e[t].rank > 1 for t, e in zip(c.token_ids, c.logprobs))
    assert all(isinstance(e[t], Logprob) and e[t].rank >= 1
               for e, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:]))
    lp = c.logprobs[0][c.token_ids[0]]
    assert repr(lp).startswith("Logprob(logprob=") and pickle.loads(pickle.dumps(lp)).rank == lp.rank
    assert json.loads(json.dumps({"lp": lp}))["lp"] == float(lp)


def test_prompt_logprobs(llm, llama):
    (out,) = llm.generate(PROMPTS[3], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=0),
                          use_tqdm=False)
    plp, ids = out.prompt_logprobs, out.prompt_token_ids
    assert len(plp) == len(ids) and plp[0] is None
    assert [list(e) for e in plp[1:]] == [[t] for t in ids[1:]]
    ref = llama.create_completion(PROMPTS[3], temperature=0, max_tokens=1, echo=True, logprobs=0)
    ref_lp = ref["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]
    assert np.allclose([e[t] for e, t in zip(plp[1:], ids[1:])], ref_lp, atol=1e-3)


def test_chat_renders_the_template_like_llama(llm, llama):
    conversations = [[{"role": "user", "content": "What is the capital of France?"}],
                     [{"role": "system", "content": "You answer in one word."},
                      {"role": "user", "content": "Name a color."}]]
    outs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert len(outs) == 2
    for conversation, out in zip(conversations, outs):
        assert out.prompt.startswith("<|im_start|>") and out.prompt.endswith("<|im_start|>assistant\n")
        # The template's markers are special tokens, not their spelled-out text.
        assert out.prompt_token_ids == list(llama._tok.encode(out.prompt.encode(), False, True))
        ref = llama.create_chat_completion(conversation, temperature=0, max_tokens=12)
        assert out.outputs[0].text == ref["choices"][0]["message"]["content"]
    # One conversation, a template of the caller's, and its kwargs.
    (one,) = llm.chat(conversations[0], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False,
                      chat_template="{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
                      chat_template_kwargs={"greeting": "Q: "})
    assert one.prompt == "Q: What is the capital of France?"


def test_get_tokenizer_has_hf_api(llm, llama):
    tok = llm.get_tokenizer()
    text = "Hello, world! <|im_end|> ünïcode"
    ids = tok.encode(text)
    assert ids == llama.tokenize(text.encode(), add_bos=True, special=True)
    assert tok.decode(ids) == text and tok.eos_token_id == llama.token_eos() and len(tok) == tok.vocab_size
    assert tok.eos_token == "<|im_end|>" and tok.convert_ids_to_tokens(tok.eos_token_id) == "<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "Hello, world!  ünïcode"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    (out,) = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert prompt == out.prompt and "<|im_start|>" in tok.chat_template
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == out.prompt_token_ids
    with pytest.raises(TypeError, match="must be a str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="token id 999999 is outside the vocabulary"):
        tok.decode([1, 999999])


@pytest.mark.parametrize("prompts, params, error", [
    (None, None, "prompts must be a str, token ids, a prompt dict or a list of those, got NoneType"),
    (5, None, "prompts must be a str, token ids, a prompt dict or a list of those, got int"),
    ("hi", {"temperature": 0}, "sampling_params must be a SamplingParams, got dict"),
    (["hi", "there"], [SamplingParams(), "greedy"], "sampling_params must be a SamplingParams, got str"),
])
def test_generate_bad_argument_types(llm, prompts, params, error):
    """A wrong type is a TypeError naming the argument, not an AttributeError from inside; a batch
    with one bad entry leaves nothing behind."""
    with pytest.raises(TypeError, match=error):
        llm.generate(prompts, params, use_tqdm=False)
    wait_until(lambda: idle(llm))


def test_chat_bad_input(llm):
    with pytest.raises(ValueError, match="conversation is a list of message dicts"):
        llm.chat([[{"role": "user", "content": "hi"}], "not a conversation"], use_tqdm=False)
    with pytest.raises(ValueError, match="chat template"):
        llm.chat([{"role": "user", "content": "hi"}], chat_template="{{ raise_exception('no users here') }}",
                 use_tqdm=False)
    with pytest.raises(ValueError, match="does not parse"):
        llm.chat([{"role": "user", "content": "hi"}], chat_template="{% for %}", use_tqdm=False)
    wait_until(lambda: idle(llm))
    assert llm.chat([], use_tqdm=False) == []


def test_prefix_cache_serves_a_repeated_prompt(llm):
    prompt = "The history of the printing press begins in the fifteenth century, when Gutenberg, " \
             "a goldsmith from Mainz, built a press with movable metal type. " * 2
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    again = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 16 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_prompt_too_long_for_n_ctx(llm):
    with pytest.raises(ValueError, match="prompt is 600 tokens and n_ctx is 512.*at least 601"):
        llm.generate([list(range(100, 700))], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt is 512 tokens and n_ctx is 512"):
        llm.generate([list(range(100, 612))], GREEDY, use_tqdm=False)
    # A bad prompt after good ones: nothing stays submitted.
    with pytest.raises(ValueError, match="n_ctx"):
        llm.generate([PROMPTS[0], list(range(100, 700))], GREEDY, use_tqdm=False)
    wait_until(lambda: idle(llm))
    # max_tokens None, or more than the context holds (capped, as vLLM's LLM and Llama do; min_tokens
    # with it): up to the end of the context.
    for params in (SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=200, min_tokens=150)):
        (out,) = llm.generate(list(range(100, 500)), params, use_tqdm=False)
        assert len(out.outputs[0].token_ids) == 112 and out.outputs[0].finish_reason == "length"


def test_progress_bar_and_empty_input(llm, capfd):
    assert llm.generate([], GREEDY) == []
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=True)
    assert "Processed prompts" in capfd.readouterr().err


def test_keyboard_interrupt_cancels_everything(llm):
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS * 4, params, use_tqdm=False)
        time.sleep(60)   # generate was quicker than the timer: wait for the interrupt here
    timer.cancel()
    wait_until(lambda: idle(llm))
    # The engine goes on serving.
    assert llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_closed_llm_refuses(smollm2_path):
    model = LLM(smollm2_path, n_ctx=64, max_num_seqs=2)
    model.close()
    model.close()
    with pytest.raises(ValueError, match="closed"):
        model.generate("hi", use_tqdm=False)


def test_vllm_spellings_of_the_model_and_its_length(smollm2_path):
    with LLM(model=smollm2_path, max_model_len=96, max_num_seqs=2) as model:
        assert model.n_ctx == 96 and model.model_path == str(smollm2_path)
    with pytest.raises(ValueError, match="model_path or as model="):
        LLM(smollm2_path, model=smollm2_path)
    with pytest.raises(ValueError, match="model_path or as model="):
        LLM(n_ctx=64)
    with pytest.raises(ValueError, match="n_ctx=64 and max_model_len=96"):
        LLM(smollm2_path, n_ctx=64, max_model_len=96)
