"""K and V caches of different types (llama.cpp's -ctk / -ctv on their own): the SmolLM2 logits on
the CPU with each mixed pair against the f16 cache, and the Context / Llama / tool arguments."""
import argparse

import numpy as np
import pytest

from conftest import REFERENCE
from ember import _ember
from ember import options
from ember.llama import Llama
from ember.options import kv_cache_type, kv_cache_types


@pytest.fixture(scope="module")
def model(smollm2_path):
    return _ember.Model(smollm2_path)


def _logits(model, tokens, type_k, type_v):
    ctx = _ember.Context(model, n_ctx=64, n_threads=2, type_k=type_k, type_v=type_v)
    ctx.eval(tokens, logits_all=True)
    return ctx.all_logits()


@pytest.mark.parametrize("type_k, type_v", [("q8_0", "f16"), ("f16", "q8_0")])
def test_mixed_cache_close_to_f16(model, rng, type_k, type_v):
    tokens = model.tokenizer.encode((REFERENCE / "apache-2.0.txt").read_bytes(), True, False)
    means = []
    for start in rng.integers(0, len(tokens) - 40, 4):
        window = list(tokens[start:start + 40])
        f16, mixed = _logits(model, window, "f16", "f16"), _logits(model, window, type_k, type_v)
        assert not np.array_equal(mixed, f16)   # the q8_0 cache is in use
        means.append(float((np.linalg.norm(mixed - f16, axis=1) / np.linalg.norm(f16, axis=1)).mean()))
    # One q8_0 cache moves the logits at most as much as two do (test_model.py bounds q8_0/q8_0
    # by the same mean over four windows, with the reasons it is that large).
    assert np.mean(means) < 0.12, f"relative error per row, mean of each window: {np.round(means, 3)}"


def test_mixed_cache_matches_its_parts(model):
    """f32 is exact on the CPU, so (q8_0, f32) and (f32, q8_0) each lie close to the f32 cache and
    differ from each other; kv_type names both caches at once."""
    tokens = list(model.tokenizer.encode(b"The quick brown fox jumps over the lazy dog, again and again.",
                                         True, False))
    f32 = _logits(model, tokens, "f32", "f32")
    k8, v8 = _logits(model, tokens, "q8_0", "f32"), _logits(model, tokens, "f32", "q8_0")
    both = _ember.Context(model, _ember.ContextParams(n_ctx=64, n_threads=2, type_k="q8_0", type_v="q8_0"))
    both.eval(tokens, logits_all=True)
    np.testing.assert_array_equal(both.all_logits(), _logits(model, tokens, "q8_0", "q8_0"))
    assert not np.array_equal(k8, v8)
    for x in (k8, v8):
        assert np.mean(np.linalg.norm(x - f32, axis=1) / np.linalg.norm(f32, axis=1)) < 0.12


def test_bf16_cache(model):
    """A bf16 cache (ggml type 30, K and V each on its own) lies about as close to the f32 cache as
    the f16 cache does (mean relative error per row about 0.05 on this text, q8_0 0.06), and each
    bf16 cache takes effect."""
    tokens = list(model.tokenizer.encode(b"The quick brown fox jumps over the lazy dog, again and again.",
                                         True, False))
    f32 = _logits(model, tokens, "f32", "f32")
    for type_k, type_v in (("bf16", "bf16"), ("bf16", "f32"), ("f32", "bf16")):
        got = _logits(model, tokens, type_k, type_v)
        assert not np.array_equal(got, f32), f"K {type_k} V {type_v} gives the f32 cache's logits"
        assert np.mean(np.linalg.norm(got - f32, axis=1) / np.linalg.norm(f32, axis=1)) < 0.08
    assert kv_cache_types(30, "bf16") == ("bf16", "bf16")


def test_iq4_nl_cache(model):
    """iq4_nl caches (ggml type 20, llama.cpp's -ctk / -ctv iq4_nl), K and V each on its own: each takes effect
    and lies about as close to the f32 cache as q4_0 does."""
    tokens = list(model.tokenizer.encode(b"The quick brown fox jumps over the lazy dog, again and again.",
                                         True, False))
    f32 = _logits(model, tokens, "f32", "f32")
    q4 = _logits(model, tokens, "q4_0", "q4_0")
    q4_err = np.mean(np.linalg.norm(q4 - f32, axis=1) / np.linalg.norm(f32, axis=1))
    for type_k, type_v in (("iq4_nl", "iq4_nl"), ("iq4_nl", "f32"), ("f32", "iq4_nl")):
        got = _logits(model, tokens, type_k, type_v)
        assert not np.array_equal(got, f32), f"K {type_k} V {type_v} gives the f32 cache's logits"
        assert np.mean(np.linalg.norm(got - f32, axis=1) / np.linalg.norm(f32, axis=1)) < 1.5 * q4_err + 0.02
    assert kv_cache_types(20, "iq4_nl") == ("iq4_nl", "iq4_nl")


def test_context_kv_type_errors(model):
    with pytest.raises(ValueError, match="type_v must be 'f16', 'bf16', .* or 'iq4_nl', got 'q6_k'"):
        _ember.Context(model, n_ctx=16, type_v="q6_k")
    with pytest.raises(ValueError, match="ContextParams has no field 'kv_type'; its fields: n_ctx, .*type_k"):
        _ember.Context(model, n_ctx=16, kv_type="q8_0")


def test_llama_and_tool_arguments(smollm2_path, model):
    assert kv_cache_types() == ("f16", "f16")
    assert kv_cache_types(8) == ("q8_0", "f16") and kv_cache_types(None, "q8_0") == ("f16", "q8_0")
    assert kv_cache_types(1, 0) == ("f16", "f32")
    with pytest.raises(ValueError, match="type_v must be a KV cache type.*'q6_k'"):
        kv_cache_types("f16", "q6_k")
    # Tools that size K and V as one type still ask for one.
    assert kv_cache_type(8, "q8_0") == "q8_0"
    with pytest.raises(ValueError, match=r"type_k \(q8_0\) and type_v \(f16\) must be the same"):
        kv_cache_type(8, None)
    # -ctk alone: V keeps llama.cpp's default f16.
    ap = argparse.ArgumentParser()
    options.add_arguments(ap, options.EMBER, ["type_k", "type_v"])
    args = ap.parse_args(["-ctk", "q8_0"])
    assert kv_cache_types(args.type_k, args.type_v) == ("q8_0", "f16")
    # Llama(type_k=q8_0) runs K q8_0, V f16: the logits of a Context with those caches.
    llm = Llama(smollm2_path, n_ctx=64, n_threads=2, type_k=8, verbose=False)
    tokens = list(model.tokenizer.encode(b"Hello there, general", True, False))
    llm._ctx.eval(tokens, logits_all=True)
    np.testing.assert_array_equal(llm._ctx.all_logits(), _logits(model, tokens, "q8_0", "f16"))
