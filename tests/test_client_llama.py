"""Llama as llama-cpp-python 0.3's users drive it (issue 43): a script written for it run unchanged,
save_state / load_state and pickling, logits_all with scores / eval_logits, set_cache (RAM and
disk), metadata, chat_format, mirostat v1/v2 and typical_p (the sampler's), from_pretrained."""
import os
import pickle

import numpy as np
import pytest

from ember import Llama, _ember
from ember.chat.formats import FORMATS
from ember.llama_state import LlamaDiskCache, LlamaRAMCache, LlamaState

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with Llama(smollm2_path, n_ctx=256, n_threads=2, verbose=False, seed=7) as model:
        yield model


def test_a_llama_cpp_python_script_runs_unchanged(smollm2_path):
    """The README example of llama-cpp-python, with the arguments its users pass."""
    llm = Llama(model_path=smollm2_path, n_gpu_layers=0, n_ctx=512, seed=1337, n_threads=2, verbose=False,
                chat_format="chatml", logits_all=False, use_mlock=False)
    output = llm("Q: Name the planets in the solar system? A: ", max_tokens=16, stop=["Q:", "\n"], echo=True)
    assert output["object"] == "text_completion" and output["choices"][0]["text"].startswith("Q: Name the planets")
    chat = llm.create_chat_completion(messages=[{"role": "system", "content": "You are a helpful assistant."},
                                                {"role": "user", "content": "Say hello."}], max_tokens=8)
    assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["completion_tokens"] > 0
    for chunk in llm.create_completion("Once upon a time", max_tokens=4, stream=True, typical_p=0.9,
                                       mirostat_mode=2):
        assert chunk["object"] == "text_completion"
    assert llm.metadata["general.architecture"] == "llama" and llm.metadata["tokenizer.ggml.add_bos_token"] == "false"
    llm.close()


def test_save_and_load_state_restore_the_continuation(llm, tmp_path):
    llm.reset()
    llm.eval(llm.tokenize(PROMPT.encode()))
    state = llm.save_state()
    assert state.n_tokens == llm.n_tokens and state.llama_state_size > 0
    want = llm.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.create_completion("Something else entirely", max_tokens=3, temperature=0)
    restored = pickle.loads(pickle.dumps(state))
    llm.load_state(restored)
    assert list(llm.input_ids) == list(state.input_ids)
    np.testing.assert_allclose(llm.scores[-1], state.scores[-1], rtol=1e-4, atol=1e-4)
    assert llm.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"] == want
    with pytest.raises(TypeError, match="LlamaState"):
        llm.load_state({"input_ids": [1, 2]})
    with pytest.raises(ValueError, match="vocabulary"):
        llm.load_state(LlamaState(np.array([10**7], np.int32), None, 1, 0))


def test_logits_all_keeps_every_row(smollm2_path):
    with Llama(smollm2_path, n_ctx=128, n_threads=2, verbose=False, logits_all=True) as full, \
            Llama(smollm2_path, n_ctx=128, n_threads=2, verbose=False) as last_only:
        tokens = full.tokenize(PROMPT.encode())
        full.eval(tokens)
        last_only.eval(tokens)
        assert full.scores.shape == (len(tokens), full.n_vocab()) and np.isfinite(full.scores).all()
        assert len(full.eval_logits) == len(tokens)
        # The row of a position predicts the next token: the prompt's own tokens rank high.
        assert last_only.scores.shape == full.scores.shape and np.isnan(last_only.scores[0]).all()
        np.testing.assert_allclose(last_only.scores[-1], full.scores[-1], rtol=1e-3, atol=1e-3)
        assert len(last_only.eval_logits) == 1
        out = full.create_completion(PROMPT, max_tokens=3, temperature=0)
        assert full.scores.shape[0] == full.n_tokens == len(tokens) + out["usage"]["completion_tokens"] - 1


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_set_cache(llm, tmp_path, kind):
    cache = LlamaRAMCache(capacity_bytes=1 << 30) if kind == "ram" else LlamaDiskCache(str(tmp_path / "c" / "d"))
    llm.set_cache(cache)
    try:
        llm.reset()
        first = llm.create_completion(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"]
        assert cache.cache_size > 0 and llm.tokenize(PROMPT.encode()) in cache
        llm.reset()
        assert llm.create_completion(PROMPT, max_tokens=4, temperature=0)["choices"][0]["text"] == first
        state = cache[llm.tokenize(PROMPT.encode())]
        assert isinstance(state, LlamaState)
        with pytest.raises(KeyError):
            cache[[5, 6, 7]]
    finally:
        llm.set_cache(None)
    with pytest.raises(TypeError):
        llm.set_cache({})
    with pytest.raises(ValueError, match="capacity_bytes"):
        LlamaRAMCache(capacity_bytes=0)


def test_chat_formats(smollm2_path):
    for name in FORMATS:
        with Llama(smollm2_path, n_ctx=128, n_threads=2, verbose=False, chat_format=name) as model:
            r = model.create_chat_completion([{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
            assert r["choices"][0]["message"]["role"] == "assistant", name
    with pytest.raises(ValueError, match="chat_format 'alpaca2' is not one of"):
        Llama(smollm2_path, n_ctx=64, verbose=False, chat_format="alpaca2")


def _draws(rng, scale=3.0, **kw):
    logits = rng.normal(0, scale, 512).astype(np.float32)
    sampler = _ember.Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=int(rng.integers(1 << 30)), **kw)
    return logits, [sampler.sample(logits) for _ in range(400)]


def test_typical_p_keeps_the_typical_tokens(rng):
    logits, draws = _draws(rng, scale=1.0, typical_p=0.3)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    entropy = -(p * np.log(p)).sum()
    distance = np.abs(-np.log(p) - entropy)
    order = np.argsort(distance, kind="stable")
    kept = order[:np.searchsorted(np.cumsum(p[order]), 0.3) + 1]
    assert set(draws) <= set(kept.tolist()) and len(set(draws)) > len(kept) // 2 > 10
    with pytest.raises(ValueError, match="typical_p"):
        _ember.Sampler(typical_p=0.0)


@pytest.mark.parametrize("mode", [1, 2])
def test_mirostat_lowers_the_surprise_toward_tau(rng, mode):
    """Logits whose entropy is far above tau: mirostat truncates so the drawn tokens are less
    surprising than plain sampling's (which average the entropy), the more so the lower tau."""
    def mean_surprise(**kw):
        logits, draws = _draws(np.random.default_rng(seed), scale=1.0, **kw)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return -np.log2(p[draws])[100:].mean(), -(p * np.log2(p)).sum()
    seed = int(rng.integers(1 << 30))
    plain, entropy = mean_surprise()
    low, _ = mean_surprise(mirostat=mode, mirostat_tau=3.0, mirostat_eta=0.1)
    high, _ = mean_surprise(mirostat=mode, mirostat_tau=6.0, mirostat_eta=0.1)
    assert entropy > 7.5 and abs(plain - entropy) < 0.5
    assert low < high < plain - 0.5
    with pytest.raises(ValueError, match="mirostat"):
        _ember.Sampler(mirostat=3)
    with pytest.raises(ValueError, match="mirostat_tau"):
        _ember.Sampler(mirostat=2, mirostat_tau=-1.0)


def test_from_pretrained_reads_the_local_hf_cache(smollm2_path, tmp_path):
    snapshot = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    os.symlink(smollm2_path, snapshot / "smollm2-135m-instruct-q4_1.gguf")
    with Llama.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "*q4_1.gguf", cache_dir=str(tmp_path),
                               n_ctx=64, verbose=False) as model:
        assert model.n_vocab() == 49152
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache.*hf download"):
        Llama.from_pretrained("someone/missing-GGUF", "*.gguf", cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no file matching"):
        Llama.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "*q8_0.gguf", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="owner/name"):
        Llama.from_pretrained("no-slash", "*.gguf", cache_dir=str(tmp_path))
