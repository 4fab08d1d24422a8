"""Every tiny model of tests/reference/hf with all its blocks on the GPU and an f32 KV cache: logits
within 1e-4 of transformers' (max|diff|/max|ref|), as one prompt batch and token by token, the bar the
CPU meets in each architecture's own tests. The f32 cache takes the GPU's all-f32 attention kernel."""

import json

import hf_tiny
import numpy as np
import pytest

with open(hf_tiny.REFERENCE / "outputs.json", encoding="utf-8") as _f:
    CASES = [(e["model"], tuple(e["ids"])) for e in json.load(_f)["logits"]]
# Contexts other than 64: LongRoPE takes its short factors only while n_ctx is within the original context (as
# llama.cpp), where transformers goes by the sequence's length (tests/test_arch_fused.py's CASES).
N_CTX = {"phi3-short": 32}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> the path of its f32 GGUF by ember-convert, made on first use."""
    from ember import _ember
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    paths = {}

    def get(name):
        if name not in paths:
            paths[name] = hf_tiny.converted(tmp_path_factory, [name], "cuda_f32")[name][2]
        return paths[name]

    return get


@pytest.mark.parametrize("chunk", [64, 1], ids=["prompt", "token_by_token"])
@pytest.mark.parametrize("name,ids", CASES, ids=[name for name, _ in CASES])
def test_cuda_f32_logits_match_transformers(converted, name, ids, chunk):
    path = converted(name)
    try:
        got = hf_tiny.ember_logits(path, list(ids), n_gpu_layers=-1, kv_type="f32", chunk=chunk,
                                   n_ctx=N_CTX.get(name, 64))
    except Exception as e:  # an architecture that runs on the CPU only says so when its blocks are placed
        if "cannot have blocks on the GPU" not in str(e):
            raise
        pytest.skip(str(e))
    want = hf_tiny.CommittedReference().logits(name, list(ids))
    assert got.shape == want.shape
    rel = hf_tiny.rel_diff(got, want)
    assert rel <= 1e-4, f"{name}: max|diff|/max|ref| = {rel:.2e}"
    assert np.isfinite(got).all()
