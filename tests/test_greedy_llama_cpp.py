"""llama.cpp (llama-simple: CPU, greedy, f16 KV cache) loads each tiny mixture-of-experts, hybrid and
latent-attention model converted by ember-convert, and ember's greedy tokens have the bytes of its pieces
(tests/reference/moe_hybrid, tools/gen_moe_hybrid_greedy_references.py). Where llama.cpp departs from
transformers on purpose-built configs, the two agree up to the recorded point and then differ, for the
recorded reason (ember follows transformers: each architecture's own tests hold it to 1e-4)."""
import json

import hf_tiny
import pytest

REFS = json.loads((hf_tiny.ROOT / "tests" / "reference" / "moe_hybrid" / "llama_cpp_greedy.json").read_text(
    encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(REFS))
def test_greedy_text_matches_llama_cpp(tmp_path, name):
    from ember.convert import convert
    ref = REFS[name]
    hf_dir, path = tmp_path / name, tmp_path / f"{name}.gguf"
    hf_tiny.build(name, str(hf_dir))
    convert(str(hf_dir), str(path), "f32", progress=False)
    got = hf_tiny.greedy_bytes(str(path), ref["prompt"], ref["n_predict"])
    want = bytes.fromhex(ref["text_hex"])
    if "agree_bytes" not in ref:
        assert got == want, got
        return
    n = ref["agree_bytes"]
    assert got[:n] == want[:n] and got != want, f"{name} ({ref['why']}): {got}"
