"""ember.Llama (llama-cpp-python's API) and the `ember` CLI on the real SmolLM2-135M model:
llama.cpp's greedy text, teacher-forced (tests/reference/smollm2/greedy.jsonl), result shapes, streaming,
stop strings, seeds, logprobs, prefix reuse and context limits."""
import _thread
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import assert_follows_llama_cpp_greedy, at_simd_level, simd_levels
from ember.llama import Llama
from ember.options import kv_cache_type, kv_cache_types


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with Llama(smollm2_path, n_ctx=512, verbose=False) as model:
        yield model


@pytest.fixture(scope="module")
def small(smollm2_path):
    """A second context of only 40 tokens, for the context-limit paths."""
    with Llama(smollm2_path, n_ctx=40, n_batch=16, verbose=False) as model:
        yield model


def greedy(llm, prompt, n, **kw):
    return llm.create_completion(prompt, max_tokens=n, temperature=0.0, **kw)


def test_follows_llama_cpp_greedy_text(llm):
    assert_follows_llama_cpp_greedy(llm)


def test_follows_llama_cpp_at_the_scalar_level(smollm2_path):
    if simd_levels()[0] == "scalar":
        pytest.skip("this run is at the scalar level already")
    with at_simd_level("scalar"):   # the context's CPU backend keeps the level it was made with
        model = Llama(smollm2_path, n_ctx=512, verbose=False)
    with model:
        assert_follows_llama_cpp_greedy(model, "scalar: ")


def test_completion_dict_shape(llm, smollm2_path):
    prompt = "Once upon a time"
    out = llm(prompt, max_tokens=4, temperature=0.7, seed=11)
    assert set(out) == {"id", "object", "created", "model", "choices", "usage"}
    assert out["id"].startswith("cmpl-") and out["object"] == "text_completion"
    assert isinstance(out["created"], int) and out["model"] == smollm2_path
    (choice,) = out["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["logprobs"] is None and isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    n_prompt = len(llm.tokenize(prompt.encode(), special=True))
    assert out["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 4, "total_tokens": n_prompt + 4}
    assert llm(prompt, max_tokens=3, model="my-name")["model"] == "my-name"


def test_model_facts(llm):
    assert llm.n_ctx() == 512 and llm.n_vocab() == 49152
    assert llm.token_eos() >= 0
    assert llm.n_embd() == 576


def test_stream_concatenates_to_non_stream(llm):
    prompt = "def fibonacci(n):"
    whole = greedy(llm, prompt, 16)
    chunks = list(greedy(llm, prompt, 16, stream=True))
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_stop_string_split_across_tokens(llm):
    prompt = "The capital of France is"
    full = greedy(llm, prompt, 24)["choices"][0]["text"]
    # A stop string that begins inside one token and ends inside the next.
    ids = llm.tokenize(full.encode(), add_bos=False)
    pieces = [llm.detokenize([t]).decode() for t in ids]
    ends = np.cumsum([len(p) for p in pieces])
    b = int(next(e for e, p in zip(ends, pieces[1:]) if e >= 4 and len(p) >= 3))
    stop = full[b - 2:b + 2]
    expected = full[:full.index(stop)]
    out = greedy(llm, prompt, 24, stop=[stop, "never-appears"])
    assert out["choices"][0]["text"] == expected and out["choices"][0]["finish_reason"] == "stop"
    chunks = [c["choices"][0]["text"] for c in greedy(llm, prompt, 24, stop=stop, stream=True)]
    assert "".join(chunks) == expected
    assert not any(stop in c for c in chunks)
    # A stop string whose start appears but which never completes holds text back, then releases it.
    chunks = [c["choices"][0]["text"] for c in greedy(llm, prompt, 24, stop=stop + "\x00", stream=True)]
    assert "".join(chunks) == full
    # The earliest of several stop strings wins.
    out = greedy(llm, prompt, 24, stop=[full[b + 1:b + 3], stop])
    assert out["choices"][0]["text"] == full[:min(full.index(stop), full.index(full[b + 1:b + 3]))]


def test_end_of_generation_stops(llm):
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    out = greedy(llm, prompt, 40)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] < 40 and "<|im_end|>" not in out["choices"][0]["text"]


def test_seed_reproducibility(llm):
    kw = dict(max_tokens=8, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    prompt = "My favourite word is"
    a = llm(prompt, seed=1234, **kw)["choices"][0]["text"]
    b = llm(prompt, seed=1234, **kw)["choices"][0]["text"]
    c = [llm(prompt, seed=s, **kw)["choices"][0]["text"] for s in (1, 2)]
    assert a == b
    assert len(set(c + [a])) > 1


def test_logprobs(llm):
    prompt = "The three primary colors are"
    out = greedy(llm, prompt, 6, logprobs=3)
    text, lp = out["choices"][0]["text"], out["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert all(len(v) == 6 for v in lp.values())
    assert "".join(lp["tokens"]) == text
    assert lp["text_offset"][0] == len(prompt)
    assert lp["text_offset"] == [len(prompt) + len("".join(lp["tokens"][:i])) for i in range(6)]
    for tok, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert lpv <= 0.0 and 1 <= len(top) <= 4
        assert math.isclose(top[tok], lpv) and math.isclose(max(top.values()), lpv)   # greedy = most likely
    # The first logprob against a log-softmax of the logits computed here.
    llm.reset()
    ids = llm.tokenize(prompt.encode(), special=True)
    llm.eval(ids)
    logits = llm._ctx.logits().astype(np.float64)
    ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert math.isclose(lp["token_logprobs"][0], ref.max(), abs_tol=1e-4)
    # Streaming gives the same entries, spread over the chunks.
    merged = {k: [] for k in lp}
    for c in greedy(llm, prompt, 6, logprobs=3, stream=True):
        for k, v in (c["choices"][0]["logprobs"] or {}).items():
            merged[k].extend(v)
    assert merged["tokens"] == lp["tokens"] and np.allclose(merged["token_logprobs"], lp["token_logprobs"])


def test_echo_with_logprobs(llm):
    prompt = "Water boils at"
    out = greedy(llm, prompt, 3, echo=True, logprobs=2)
    text, lp = out["choices"][0]["text"], out["choices"][0]["logprobs"]
    n_prompt = len(llm.tokenize(prompt.encode(), special=True))
    assert text.startswith(prompt) and len(text) > len(prompt)
    assert len(lp["tokens"]) == n_prompt + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v <= 0.0 for v in lp["token_logprobs"][1:])
    assert lp["text_offset"][0] == 0 and lp["text_offset"][n_prompt] == len(prompt)


def test_prefix_reuse_gives_fresh_results(llm):
    base = "In machine learning, overfitting means"
    greedy(llm, base, 8)
    longer = base + " that the model"
    reused = greedy(llm, longer, 12)["choices"][0]["text"]
    assert llm.n_tokens >= len(llm.tokenize(longer.encode(), special=True))
    llm.reset()
    assert llm.n_tokens == 0
    fresh = greedy(llm, longer, 12)["choices"][0]["text"]
    assert reused == fresh
    # Token-id prompts work too, and the same prompt again re-evaluates only its last token.
    ids = llm.tokenize(longer.encode(), special=True)
    assert greedy(llm, ids, 12)["choices"][0]["text"] == fresh


def test_tokenize_detokenize_round_trip(llm):
    text = "Grüße aus Köln! 東京 🙂 x = [1, 2, 3]\n\tdef f(): return 0x1F"
    ids = llm.tokenize(text.encode(), add_bos=False)
    assert all(0 <= t < llm.n_vocab() for t in ids)
    assert llm.detokenize(ids) == text.encode()
    assert llm.tokenize(b"<|im_start|>", add_bos=False, special=True) != \
        llm.tokenize(b"<|im_start|>", add_bos=False, special=False)


def test_context_limits(small):
    with pytest.raises(ValueError, match="prompt is 50 tokens and n_ctx is 40.*at least 51"):
        small(list(range(100, 150)), max_tokens=4)
    with pytest.raises(ValueError, match="40"):
        small(" ".join(["hello"] * 60), max_tokens=4)
    # max_tokens None: generate until the context is full.
    out = small("Once upon a time, there was a little", max_tokens=None, temperature=0.0,
                logit_bias={small.token_eos(): -math.inf})
    assert out["choices"][0]["finish_reason"] in ("length", "stop")
    if out["choices"][0]["finish_reason"] == "length":
        assert out["usage"]["total_tokens"] == 40
    with pytest.raises(ValueError, match="40"):
        small.eval(list(range(100, 150)))


def test_bad_arguments(llm):
    with pytest.raises(ValueError, match="top_p"):
        llm("hi", top_p=0.0)
    with pytest.raises(ValueError, match="typical_p"):
        llm("hi", typical_p=0.0)   # (0.5 works: typical sampling)
    with pytest.raises(TypeError, match="not_a_llama_arg"):
        Llama("unused.gguf", not_a_llama_arg=1)


def test_kv_cache_type_arguments(llm, smollm2_path):
    # llama-cpp-python's type_k / type_v: ggml type ids (1 f16, 0 f32, 8 q8_0) or their names.
    assert kv_cache_type() == "f16"
    assert kv_cache_type(8, "q8_0") == "q8_0" and kv_cache_type(0, 0) == "f32"
    with pytest.raises(ValueError, match=r"type_k \(q8_0\) and type_v \(f16\)"):
        kv_cache_type(8, None)
    with pytest.raises(ValueError, match="type_k.*'q6_k'"):
        kv_cache_type("q6_k", "q6_k")
    with pytest.raises(ValueError, match="type_v.*14"):
        kv_cache_type(8, 14)
    # Llama itself takes K and V types each on its own (llama.cpp's -ctk / -ctv): tests/test_kv_types.py.
    assert kv_cache_types(8, None) == ("q8_0", "f16")
    prompt = "The capital of France is"
    with Llama(smollm2_path, n_ctx=64, type_k=8, type_v=8, verbose=False) as q8:
        # The first token's f16 top-two margin (2.4) is beyond what the q8_0 rounding moves.
        assert greedy(q8, prompt, 1)["choices"][0]["text"] == greedy(llm, prompt, 1)["choices"][0]["text"]


def test_verbose_prints_one_line(smollm2_path, capfd):
    with Llama(smollm2_path, n_ctx=64, verbose=True) as model:
        assert model.n_ctx() == 64
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ember" in err[0] and "llama" in err[0]
    with pytest.raises(ValueError, match="closed"):
        model("hi")


def test_cli_prints_completion(llm, smollm2_path):
    prompt = "The capital of France is"
    expected = greedy(llm, prompt, 8)["choices"][0]["text"]
    # The subprocess imports ember the way this process did (installed, or EMBER_DEV_BUILD + PYTHONPATH).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run([sys.executable, "-m", "ember.cli", "-m", smollm2_path, "-p", prompt, "-n", "8",
                          "--temp", "0", "-c", "128", "-t", "2"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected + "\n"
    bad = subprocess.run([sys.executable, "-m", "ember.cli", "-m", smollm2_path, "-p", prompt, "--top-p", "2"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "top_p" in bad.stderr
    # -ctk alone: K q8_0, V f16, as llama.cpp takes it.
    mixed = subprocess.run([sys.executable, "-m", "ember.cli", "-m", smollm2_path, "-p", prompt, "-n", "4",
                            "-c", "128", "-t", "2", "-ctk", "q8_0"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert mixed.returncode == 0 and mixed.stdout.strip(), mixed.stderr


def test_interrupt_keeps_the_finished_batches(smollm2_path):
    # Ctrl-C during a long prompt: KeyboardInterrupt comes between two n_batch chunks, and the
    # context keeps exactly the chunks done, so the same prompt afterwards resumes from them.
    prompt = "The quick brown fox jumps over the lazy dog. " * 100
    with Llama(smollm2_path, n_ctx=2048, n_batch=32, verbose=False) as llm:
        tokens = llm.tokenize(prompt.encode())
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            llm.eval(tokens)
            time.sleep(60)   # the eval was quicker than the timer: wait for the interrupt here
        timer.cancel()
        kept = llm.n_tokens
        assert 0 < kept < len(tokens) and kept % 32 == 0
        assert llm._ctx.n_past == kept and list(llm.input_ids) == tokens[:kept]
        resumed = greedy(llm, prompt, 4)["choices"][0]["text"]
        llm.reset()
        assert greedy(llm, prompt, 4)["choices"][0]["text"] == resumed


def test_echo_logprobs_span_batches(llm, small):
    # Prompt logits gathered over several 16-token chunks equal those of one 512-token batch.
    prompt = ("The history of the printing press begins in the fifteenth century, when Gutenberg, "
              "a goldsmith from Mainz, built a press with movable metal type")
    assert 16 < len(llm.tokenize(prompt.encode())) < 40 - 2   # two chunks, and room in the 40-token context
    one = greedy(llm, prompt, 2, echo=True, logprobs=2)["choices"][0]["logprobs"]
    chunked = greedy(small, prompt, 2, echo=True, logprobs=2)["choices"][0]["logprobs"]
    assert one["tokens"] == chunked["tokens"]
    assert np.allclose(one["token_logprobs"][1:], chunked["token_logprobs"][1:], atol=1e-3)


def test_n_threads_capped_at_hardware_threads(smollm2_path, capfd):
    hw = os.cpu_count()
    with Llama(smollm2_path, n_ctx=64, n_threads=hw + 1000, verbose=False) as llm:
        t = time.perf_counter()
        assert greedy(llm, "The capital of France is", 3)["usage"]["completion_tokens"] == 3
        assert time.perf_counter() - t < 30
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"n_threads {hw + 1000}" in err[0] and f"{hw} hardware threads" in err[0], err


def test_bytes_prompt_is_a_type_error(llm):
    # llama-cpp-python would take b"Hello" as the token ids 72, 101, 108...
    with pytest.raises(TypeError, match="got bytes.*decode"):
        llm(b"Hello")


@pytest.mark.parametrize("prompt, match", [
    (3.5, "str or a list of token ids, got float"), (None, "got NoneType"),
    ([1.5, 2], r"token ids must be integers, got 1.5"), ([1, "2"], "got '2'"), ([True], "got True"),
])
def test_prompt_of_the_wrong_type_names_it(llm, prompt, match):
    with pytest.raises(TypeError, match=match):
        llm(prompt, max_tokens=1)
    # numpy's integers are token ids too.
    assert llm(np.array(llm.tokenize(b"Hi")), max_tokens=1, temperature=0)["usage"]["prompt_tokens"] >= 1


def test_context_of_one_token_says_what_is_needed(smollm2_path):
    with Llama(smollm2_path, n_ctx=1, verbose=False) as tiny:
        with pytest.raises(ValueError, match=r"prompt is 1 token \(BOS included\) and n_ctx is 1.*at least 2"):
            tiny("")
        with pytest.raises(ValueError, match=r"prompt is 3 tokens and n_ctx is 1.*at least 4"):
            tiny("Hello, world")


def test_n_ctx_past_training_context_warns_once(smollm2_path, capfd):
    with Llama(smollm2_path, n_ctx=8192 + 64, verbose=False) as big:
        assert big.n_ctx() == 8256
        greedy(big, "Hi", 1)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_ctx 8256" in err[0] and "n_ctx_train 8192" in err[0], err
    with Llama(smollm2_path, n_ctx=8192, verbose=False):
        pass
    assert capfd.readouterr().err == ""


def test_gpu_layers_fall_back_to_cpu_without_cuda(smollm2_path, llm, capfd):
    from ember import _ember
    if "cuda" in _ember.backends():
        pytest.skip("CUDA backend built in: n_gpu_layers offloads")
    prompt = "The capital of France is"
    with Llama(smollm2_path, n_ctx=512, n_gpu_layers=-1, verbose=False) as cpu:
        got = greedy(cpu, prompt, 8)["choices"][0]["text"]
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "n_gpu_layers=-1 ignored" in err[0] and "CPU" in err[0], err
    assert got == greedy(llm, prompt, 8)["choices"][0]["text"]


def _stream_text(chunks):
    return "".join(c["choices"][0]["text"] for c in chunks)


def _in_threads(*fns, timeout=300):
    """Runs each fn in its own thread, all released at once; returns their results (re-raising
    the first exception)."""
    barrier = threading.Barrier(len(fns))
    results, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:   # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


def test_two_threads_share_one_llama(llm):
    # Calls from two threads take turns on the one context (a stream keeps it until exhausted)
    # and each gets what it gets alone.
    a, b = "The capital of France is", "def fibonacci(n):"
    want_a = greedy(llm, a, 24)["choices"][0]["text"]
    want_b = _stream_text(greedy(llm, b, 24, stream=True))
    got_a, got_b = _in_threads(lambda: [greedy(llm, a, 24)["choices"][0]["text"] for _ in range(4)],
                               lambda: [_stream_text(greedy(llm, b, 24, stream=True)) for _ in range(4)])
    assert got_a == [want_a] * 4 and got_b == [want_b] * 4


def test_a_started_stream_makes_other_threads_wait(llm):
    a, b = "Water boils at", "The three primary colors are"
    want_a = greedy(llm, a, 16)["choices"][0]["text"]
    want_b = greedy(llm, b, 12)["choices"][0]["text"]
    stream = greedy(llm, b, 12, stream=True)
    first = next(stream)
    other = threading.Thread(target=lambda: done.append(greedy(llm, a, 16)["choices"][0]["text"]))
    done = []
    other.start()
    time.sleep(0.5)
    assert not done   # waiting for the stream, not cutting into it
    assert _stream_text([first, *stream]) == want_b
    other.join(120)
    assert done == [want_a]
    # A stream closed early gives the context back at once.
    stream = greedy(llm, b, 12, stream=True)
    next(stream)
    stream.close()
    assert _in_threads(lambda: greedy(llm, a, 16)["choices"][0]["text"]) == [want_a]


def test_a_stream_can_move_between_threads(llm):
    # A server's thread pool may advance one stream from a different thread each chunk.
    prompt = "Once upon a time"
    want = greedy(llm, prompt, 12)["choices"][0]["text"]
    stream = greedy(llm, prompt, 12, stream=True)
    chunks = []
    while True:
        (chunk,) = _in_threads(lambda: next(stream, None))
        if chunk is None:
            break
        chunks.append(chunk)
    assert _stream_text(chunks) == want
    assert _in_threads(lambda: greedy(llm, prompt, 12)["choices"][0]["text"]) == [want]
