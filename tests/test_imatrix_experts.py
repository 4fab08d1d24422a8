"""Importance matrices of mixture-of-experts models: ember-imatrix collects a stacked expert tensor's inputs
per expert (llama-imatrix's layout: sums [n_expert][n_in], a token count per expert; against llama-imatrix's
file for a fixed synthetic model, tests/reference/imatrix), and ember-quantize --imatrix quantizes each expert
with its own row of importances, as llama-quantize does."""
import gzip
import importlib.util

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from ember import _ember as E
from ember import imatrix
from ember.quantize import imatrix_weights

from conftest import REFERENCE, ROOT, rng_for

TEXT = REFERENCE / "apache-2.0.txt"
N_EXPERT, N_USED, N_CTX, N_CHUNKS = 8, 2, 64, 2


def write_moe_model(path, seed):
    spec = importlib.util.spec_from_file_location("synthetic_gguf", ROOT / "tools" / "synthetic_gguf.py")
    synthetic_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic_gguf)
    vocab = path.parent / "smollm2-vocab.gguf"
    vocab.write_bytes(gzip.decompress((ROOT / "tests" / "fuzz" / "vocab" / "smollm2.gguf.gz").read_bytes()))
    synthetic_gguf.write_model(str(path), "qwen3moe-tiny", str(vocab), ctx=256, seed=seed)
    return str(path)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return write_moe_model(tmp_path_factory.mktemp("imatrix_moe") / "qwen3moe-tiny.gguf",
                           int(rng_for("imatrix moe").integers(2**31)))


@pytest.fixture(scope="module")
def moe_imatrix(moe_model):
    return imatrix.collect(E.Model(moe_model), TEXT.read_bytes(), N_CTX, max_chunks=N_CHUNKS)


def test_each_expert_collected(moe_model, moe_imatrix):
    """Per layer: gate and up experts read the same rows (equal entries); each token reaches N_USED experts,
    so the experts' counts add up to N_USED times the router's and their sums to N_USED times the router's
    column sums (the router reads the same normed rows); down's rows are the experts' own activations."""
    n_tok = N_CTX * N_CHUNKS
    tensors = {t.name: t for t in GGUFReader(moe_model).tensors}
    layers = sorted({int(n.split(".")[1]) for n in moe_imatrix.entries})
    assert layers == list(range(4))
    for layer in layers:
        def entry(name):
            return moe_imatrix.entries[f"blk.{layer}.{name}.weight"]

        gate, up, down, router = entry("ffn_gate_exps"), entry("ffn_up_exps"), entry("ffn_down_exps"), entry(
            "ffn_gate_inp")
        n_embd = int(tensors[f"blk.{layer}.ffn_gate_exps.weight"].shape[0])
        n_ff = int(tensors[f"blk.{layer}.ffn_down_exps.weight"].shape[0])
        assert gate.sums.shape == (N_EXPERT, n_embd) and down.sums.shape == (N_EXPERT, n_ff)
        assert router.counts.tolist() == [n_tok]
        assert gate.counts.sum() == N_USED * n_tok and (gate.counts > 0).sum() > 1
        np.testing.assert_array_equal(gate.counts, up.counts)
        np.testing.assert_array_equal(gate.counts, down.counts)
        np.testing.assert_array_equal(gate.sums, up.sums)
        np.testing.assert_allclose(gate.sums.sum(axis=0, dtype=np.float64), N_USED * router.sums[0], rtol=1e-5)
        unseen = gate.counts == 0
        assert not gate.sums[unseen].any() and (gate.sums[~unseen] > 0).all()


def test_matches_llama_imatrix(tmp_path):
    """llama-imatrix -c 64 --chunks 2 on the model of seed 20261207 (tools/gen_imatrix_moe_reference.py): every entry's
    token counts (per expert: the same total, each within a token or two, as a router's near tie can fall the other
    way under the two implementations' rounding; measured: one token of 128 in one layer), layer 0's and 3's
    expert sums within float rounding."""
    ref = np.load(REFERENCE.parent / "imatrix" / "qwen3moe_tiny_c64.npz")
    path = write_moe_model(tmp_path / "qwen3moe-tiny.gguf", 20261207)
    got = imatrix.collect(E.Model(path), TEXT.read_bytes(), N_CTX, max_chunks=N_CHUNKS)
    assert sorted(got.entries) == list(ref["names"])
    for name in ref["names"]:
        counts, want = got.entries[name].counts, ref[f"counts:{name}"]
        assert counts.sum() == want.sum() and np.abs(counts - want).max() <= 2, (name, counts, want)
        if f"sums:{name}" in ref.files:
            theirs = ref[f"sums:{name}"].astype(np.float64)
            ours = got.entries[name].sums.astype(np.float64)
            seen = theirs > 0
            # measured: median 0.02-0.07 %
            assert np.median(np.abs(ours[seen] - theirs[seen]) / theirs[seen]) < 0.005, name


def test_written_as_llama_imatrix(moe_imatrix, tmp_path):
    """The GGUF file: <name>.in_sum2 of ne (n_in, n_expert) and <name>.counts of ne (1, n_expert)."""
    path = str(tmp_path / "moe.gguf")
    imatrix.write(path, moe_imatrix)
    t = {x.name: x for x in GGUFReader(path).tensors}
    s, c = t["blk.0.ffn_gate_exps.weight.in_sum2"], t["blk.0.ffn_gate_exps.weight.counts"]
    assert s.shape.tolist() == [256, N_EXPERT] and c.shape.tolist() == [1, N_EXPERT]
    back = imatrix.read(path).entries["blk.0.ffn_gate_exps.weight"]
    np.testing.assert_array_equal(back.counts, moe_imatrix.entries["blk.0.ffn_gate_exps.weight"].counts)
    # ember-quantize's reading: each expert's importances in turn, ones for an expert no token reached
    weights = np.asarray(imatrix_weights(path)["blk.0.ffn_gate_exps.weight"]).reshape(N_EXPERT, 256)
    np.testing.assert_array_equal(weights, back.importance())


def write(path, tensors):
    w = gguf.GGUFWriter(str(path), "llama")
    for name, x in tensors.items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def blocks(path) -> dict:
    return {t.name: np.asarray(t.data).reshape(-1).view(np.uint8) for t in GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "Q4_K", "IQ4_XS"])
def test_experts_quantized_each_with_its_importances(tmp_path, type_name):
    """A stacked [4][32][512] tensor with 4 rows of importances: each expert's blocks are those of the expert
    quantized on its own with its row, and differ from those with another expert's row."""
    rng = rng_for("expert imatrix", type_name)
    n_exp, n_out, n_in = 4, 32, 512
    x = (rng.standard_t(5, (n_exp, n_out, n_in)) * 0.05).astype(np.float32)
    qw = np.exp(2.0 * rng.standard_normal((n_exp, n_in))).astype(np.float32)
    write(tmp_path / "moe.gguf", {"blk.0.ffn_up_exps.weight": x})
    write(tmp_path / "each.gguf", {f"blk.{e}.ffn_up.weight": x[e] for e in range(n_exp)})
    E.quantize_model(str(tmp_path / "moe.gguf"), str(tmp_path / "moe_q.gguf"), "q8_0", n_threads=2,
                     tensor_types=[f"ffn_up_exps={type_name}"],
                     imatrix={"blk.0.ffn_up_exps.weight": qw.ravel().tolist()})
    E.quantize_model(str(tmp_path / "each.gguf"), str(tmp_path / "each_q.gguf"), "q8_0", n_threads=2,
                     tensor_types=[f"ffn_up={type_name}"],
                     imatrix={f"blk.{e}.ffn_up.weight": qw[(e + 1) % n_exp].tolist() for e in range(n_exp)})
    E.quantize_model(str(tmp_path / "each.gguf"), str(tmp_path / "own_q.gguf"), "q8_0", n_threads=2,
                     tensor_types=[f"ffn_up={type_name}"],
                     imatrix={f"blk.{e}.ffn_up.weight": qw[e].tolist() for e in range(n_exp)})
    stacked = GGUFReader(str(tmp_path / "moe_q.gguf")).tensors[0]
    assert stacked.tensor_type.name == type_name
    got = np.asarray(stacked.data).reshape(n_exp, -1).view(np.uint8)
    own, other = blocks(tmp_path / "own_q.gguf"), blocks(tmp_path / "each_q.gguf")
    for e in range(n_exp):
        np.testing.assert_array_equal(got[e], own[f"blk.{e}.ffn_up.weight"], err_msg=f"expert {e}")
        assert not np.array_equal(got[e], other[f"blk.{e}.ffn_up.weight"])


def test_expert_entry_of_wrong_size_refused(tmp_path):
    rng = rng_for("expert imatrix size")
    write(tmp_path / "moe.gguf", {"blk.0.ffn_up_exps.weight": rng.standard_normal((4, 8, 256)).astype(np.float32)})
    out = tmp_path / "o.gguf"
    with pytest.raises(ValueError, match=r"--imatrix: the entry for 'blk.0.ffn_up_exps.weight' has 256 values, but "
                                         r"its 4 experts' rows have 256 elements \(1024 expected\)"):
        E.quantize_model(str(tmp_path / "moe.gguf"), str(out), "q4_k",
                         imatrix={"blk.0.ffn_up_exps.weight": [1.0] * 256})
    assert not out.exists()
