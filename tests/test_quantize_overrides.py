"""ember-quantize's per-tensor overrides (--tensor-type REGEX=TYPE, --output-tensor-type,
--token-embedding-type): which tensors they reach, the first matching pattern winning, the K -> legacy
fallback on rows that are not a multiple of 256, bit-exact data, and the errors for bad input."""
import subprocess
import sys

import gguf
import gguf.quants
import numpy as np
import pytest
from gguf import GGUFReader

from ember import _ember as E

from conftest import rng_for
from test_quantize import N_LAYER, as_f32, quantized, reader, tiny_path  # noqa: F401 (tiny_path: fixture)


def types_of(path: str) -> dict:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def test_overrides_reach_the_tensors_they_name(tiny_path, tmp_path):
    out = str(tmp_path / "ov.gguf")
    E.quantize_model(tiny_path, out, "Q4_K_M", n_threads=2,
                     tensor_types=[r"blk\.[0-3]\.attn_v=q5_0", "attn_v=Q8_0", "ffn_down=Q6_K", "norm=Q8_0"],
                     output_tensor_type="Q4_0", token_embedding_type="q8_0")
    got, base = types_of(out), types_of(quantized(tiny_path, "Q4_K_M"))
    for name, t in got.items():
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if name.endswith("attn_v.weight"):
            want = "Q5_0" if layer < 4 else "Q8_0"   # the first matching pattern wins, as llama-quantize's
        elif name.endswith("ffn_down.weight"):
            want = "Q8_0"   # rows of 384: Q6_K falls back to Q8_0 as in the recipe
        elif name == "output.weight":
            want = "Q4_0"
        elif name == "token_embd.weight":
            want = "Q8_0"
        else:
            want = base[name]   # norms stay F32 although 'norm' matches them: only matrices are overridden
        assert t == want, name
    src = {t.name: t for t in reader(tiny_path).tensors}
    for t in GGUFReader(out).tensors:
        if t.tensor_type.name in ("Q4_0", "Q5_0", "Q8_0"):
            ref = gguf.quants.quantize(as_f32(src[t.name]), t.tensor_type)
            np.testing.assert_array_equal(np.asarray(t.data).reshape(-1), ref.reshape(-1), err_msg=t.name)
    assert sum(n.endswith("attn_v.weight") for n in got) == N_LAYER


def test_output_type_reaches_a_tied_embedding(tmp_path):
    """Without output.weight the token embedding is the head: --output-tensor-type sets it, and
    --token-embedding-type, applied after, wins over it."""
    rng = rng_for("tied embedding overrides")
    src = tmp_path / "tied.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("token_embd.weight", rng.standard_normal((64, 256)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((256, 256)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = str(tmp_path / "o.gguf")
    E.quantize_model(str(src), out, "Q4_0", output_tensor_type="Q5_1")
    assert types_of(out) == {"token_embd.weight": "Q5_1", "blk.0.attn_q.weight": "Q4_0"}
    E.quantize_model(str(src), out, "Q4_0", output_tensor_type="Q5_1", token_embedding_type="F16")
    assert types_of(out)["token_embd.weight"] == "F16"


@pytest.fixture
def narrow_path(tmp_path):
    """A matrix whose rows (48) are a multiple of no 256-element K block and of no 32-element block."""
    rng = rng_for("narrow rows")
    path = tmp_path / "narrow.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((16, 48)).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((16, 256)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("spec, message", [
    (["attn_(q=Q8_0"], r"--tensor-type: bad regular expression 'attn_\(q'"),
    (["attn_q=Q9_9"], r"--tensor-type: unknown tensor type 'Q9_9'; choose one of: .*Q4_0.*Q6_K"),
    (["attn_q=Q8_K"], r"unknown tensor type 'Q8_K'"),   # an activation format, never stored
    (["attn_q"], r"--tensor-type: expected REGEX=TYPE .*got 'attn_q'"),
    (["=Q8_0"], r"expected REGEX=TYPE"),
    (["attn_q="], r"expected REGEX=TYPE"),
    (["attn_q=Q4_0"], r"--tensor-type 'attn_q': tensor 'blk.0.attn_q.weight' has rows of 48 elements, not a "
                      r"multiple of Q4_0's blocks of 32"),
    (["attn_q=Q4_K"], r"rows of 48 elements, not a multiple of Q5_0's blocks of 32 \(K types fall back"),
])
def test_override_errors(narrow_path, tmp_path, spec, message):
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match=message):
        E.quantize_model(narrow_path, str(out), "F16", tensor_types=spec)
    assert not out.exists()   # refused before anything is written


def test_type_option_errors(narrow_path, tmp_path):
    out = str(tmp_path / "o.gguf")
    with pytest.raises(ValueError, match=r"--output-tensor-type: unknown tensor type 'Q4_K_M'"):
        E.quantize_model(narrow_path, out, "F16", output_tensor_type="Q4_K_M")
    with pytest.raises(ValueError, match=r"--token-embedding-type: unknown tensor type 'int8'"):
        E.quantize_model(narrow_path, out, "F16", token_embedding_type="int8")
    E.quantize_model(narrow_path, out, "F16", tensor_types=["ffn_up=Q4_K", "attn_q=f32"])
    assert types_of(out) == {"blk.0.attn_q.weight": "F32", "blk.0.ffn_up.weight": "Q4_K"}


def test_cli_overrides(tiny_path, tmp_path):
    out = tmp_path / "cli.gguf"
    r = subprocess.run([sys.executable, "-m", "ember.quantize", tiny_path, str(out), "Q4_0", "--threads", "2",
                        "--tensor-type", "attn_k=Q8_0", "--tensor-type", "ffn_up=Q5_1", "--output-tensor-type", "q8_0",
                        "--token-embedding-type", "Q4_1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "blk.0.attn_k.weight                      -> Q8_0" in r.stderr
    assert "blk.7.ffn_up.weight                      -> Q5_1" in r.stderr
    assert "token_embd.weight                        -> Q4_1" in r.stderr
    got = types_of(str(out))
    assert got["output.weight"] == "Q8_0" and got["blk.3.attn_q.weight"] == "Q4_0"
    r = subprocess.run([sys.executable, "-m", "ember.quantize", tiny_path, str(tmp_path / "x.gguf"), "Q4_0",
                        "--tensor-type", "attn_k=Q7"], capture_output=True, text=True)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ember-quantize: error: --tensor-type: unknown tensor type 'Q7'")
