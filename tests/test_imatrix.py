"""ember-imatrix and its files (ember.imatrix): SmolLM2's matrix against llama-imatrix's on the same
text and chunks, layer 0's inputs recomputed in numpy; the GGUF layout llama-imatrix writes (keys,
tensor names, shapes, order, no architecture), its older .dat format read into the same sums and
counts, expert (3-D) entries, and clear errors for bad files and arguments."""
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from ember import _ember as E
from ember import imatrix
from ember.perplexity import text_chunks

from conftest import REFERENCE, rng_for

TEXT = REFERENCE / "apache-2.0.txt"
# Each layer's inputs carry the rounding of the layers before it, which differs between ember and
# llama.cpp (their Q4_1 dot products quantize activations differently): measured, the median relative
# difference of a matrix's column sums is 0.3 % typically and 1.4 % at worst.
REL_MEDIAN = 0.025


def random_imatrix(seed: str) -> imatrix.Imatrix:
    rng = rng_for(seed)

    def entry(n_mat, n_in):
        counts = rng.integers(1, 500, n_mat)
        sums = (rng.gamma(0.5, 2.0, (n_mat, n_in)) * counts[:, None]).astype(np.float32)
        return imatrix.Entry(sums, counts)

    entries = {"blk.0.attn_q.weight": entry(1, 64), "blk.0.ffn_down.weight": entry(1, 96),
               "blk.1.ffn_up_exps.weight": entry(4, 64), "output.weight": entry(1, 64)}
    entries["blk.1.ffn_up_exps.weight"].counts[2] = 0   # an expert no token chose
    return imatrix.Imatrix(entries, ["calibration.txt"], int(rng.integers(1, 50)), 512)


def test_gguf_layout_as_llama_imatrix(tmp_path):
    m = random_imatrix("imatrix layout")
    path = str(tmp_path / "m.gguf")
    imatrix.write(path, m)
    r = GGUFReader(path)
    assert "general.architecture" not in r.fields
    assert bytes(r.fields["general.type"].parts[-1]).decode() == "imatrix"
    assert r.fields["imatrix.chunk_count"].types == [gguf.GGUFValueType.UINT32]
    assert r.fields["imatrix.chunk_size"].parts[-1][0] == 512
    names = [t.name for t in r.tensors]
    want = []
    for name in sorted(m.entries):
        want += [name + ".in_sum2", name + ".counts"]
    assert names == want
    for t in r.tensors:
        base = t.name.rsplit(".", 1)[0]
        e = m.entries[base]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        n_mat, n_in = e.sums.shape
        # ne as ggml writes it: no trailing 1s, so a plain matrix's entry is 1-D
        if t.name.endswith(".in_sum2"):
            assert [int(x) for x in t.shape] == ([n_in, n_mat] if n_mat > 1 else [n_in])
        else:
            assert [int(x) for x in t.shape] == ([1, n_mat] if n_mat > 1 else [1])


def test_gguf_round_trip(tmp_path):
    m = random_imatrix("imatrix round trip")
    path = str(tmp_path / "m.gguf")
    imatrix.write(path, m)
    back = imatrix.read(path)
    assert back.datasets == m.datasets and back.chunk_count == m.chunk_count and back.chunk_size == 512
    assert sorted(back.entries) == sorted(m.entries)
    for name, e in m.entries.items():
        np.testing.assert_array_equal(back.entries[name].sums, e.sums)
        np.testing.assert_array_equal(back.entries[name].counts, e.counts)
    imp = back.entries["blk.1.ffn_up_exps.weight"].importance()
    np.testing.assert_array_equal(imp[2], np.ones(64, np.float32))   # unseen expert: all columns alike
    e = m.entries["blk.1.ffn_up_exps.weight"]
    np.testing.assert_allclose(imp[0], e.sums[0] / e.counts[0], rtol=1e-6)


def dat_bytes(entries, chunk_count=None, dataset=None) -> bytes:
    out = struct.pack("<i", len(entries))
    for name, ncall, values in entries:
        raw = name.encode()
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, len(values))
        out += np.asarray(values, "<f4").tobytes()
    if chunk_count is not None:
        out += struct.pack("<i", chunk_count)
        if dataset is not None:
            out += struct.pack("<i", len(dataset)) + dataset.encode()
    return out


def test_reads_the_dat_format(tmp_path):
    rng = rng_for("imatrix dat")
    a, b = rng.gamma(0.5, 2.0, 64).astype(np.float32), rng.gamma(0.5, 2.0, 96).astype(np.float32)
    path = tmp_path / "m.dat"
    path.write_bytes(dat_bytes([("blk.0.attn_q.weight", 7, a), ("blk.0.ffn_down.weight", 7, b)], 7, "wiki.train.raw"))
    m = imatrix.read(str(path))
    assert m.chunk_count == 7 and m.datasets == ["wiki.train.raw"] and m.chunk_size == 0
    np.testing.assert_array_equal(m.entries["blk.0.attn_q.weight"].sums, a.reshape(1, -1))
    np.testing.assert_array_equal(m.entries["blk.0.ffn_down.weight"].counts, [7])
    # the trailer (chunk count, dataset) is optional, as in llama.cpp's loader
    path.write_bytes(dat_bytes([("blk.0.attn_q.weight", 3, a)]))
    m = imatrix.read(str(path))
    assert m.chunk_count == 0 and m.datasets == [] and list(m.entries) == ["blk.0.attn_q.weight"]
    # a .dat converted to GGUF keeps its sums and counts
    imatrix.write(str(tmp_path / "m.gguf"), m)
    np.testing.assert_array_equal(imatrix.read(str(tmp_path / "m.gguf")).entries["blk.0.attn_q.weight"].sums,
                                  a.reshape(1, -1))


def test_bad_files(tmp_path):
    rng = rng_for("imatrix bad files")
    good = dat_bytes([("blk.0.attn_q.weight", 3, rng.standard_normal(64) ** 2)], 3, "t.txt")
    bad = tmp_path / "bad.dat"
    for data, message in [(good[:40], r"bad.dat: file ends inside entry 'blk.0.attn_q.weight''s 64 values"),
                          (good[:10], r"bad.dat: file ends inside entry 0's name"),
                          (struct.pack("<i", 0), r"not an imatrix file \(it starts with entry count 0\)"),
                          (b"\x01\x00", r"file ends inside the entry count"),
                          (struct.pack("<ii", 1, 1 << 30), r"name length of 1073741824")]:
        bad.write_bytes(data)
        with pytest.raises(ValueError, match=message):
            imatrix.read(str(bad))
    # a GGUF that is a model, not an imatrix
    w = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((4, 32)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"model.gguf: no '\*.in_sum2' tensors: not an imatrix file"):
        imatrix.read(str(tmp_path / "model.gguf"))
    # sums without their counts
    w = gguf.GGUFWriter(str(tmp_path / "half.gguf"), "")
    w.add_tensor("blk.0.attn_q.weight.in_sum2", rng.standard_normal((1, 32)).astype(np.float32) ** 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"half.gguf: 'blk.0.attn_q.weight' has no 'blk.0.attn_q.weight.counts'"):
        imatrix.read(str(tmp_path / "half.gguf"))
    with pytest.raises(ValueError, match=r"entry 'x': sums must be \[n_mat\]\[n_in\] with n_mat counts"):
        imatrix.write(str(tmp_path / "o.gguf"), imatrix.Imatrix({"x": imatrix.Entry(np.ones((2, 4), np.float32),
                                                                                     np.array([1]))}))


@pytest.fixture(scope="module")
def smol_imatrix(smollm2_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("imatrix") / "smol.gguf"
    r = subprocess.run([sys.executable, "-m", "ember.imatrix", "-m", smollm2_path, "-f", str(TEXT), "-c", "128",
                        "--chunks", "3", "-t", "2", "-o", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 210 matrices over 3 chunks" in r.stderr
    return imatrix.read(str(path))


def test_matches_llama_imatrix(smol_imatrix):
    """llama-imatrix -c 128 --chunks 3 on the same file (tests/reference/smollm2/README.md): the same
    matrices, token counts, and column sums within float rounding of two implementations."""
    ref = np.load(REFERENCE / "imatrix_c128.npz")
    assert sorted(smol_imatrix.entries) == list(ref["names"])   # every block weight, no head (tied here)
    assert smol_imatrix.chunk_count == 3 and smol_imatrix.chunk_size == 128
    names = [n for n in ref.files if n not in ("names", "counts")]
    for name, count in zip(names, ref["counts"]):
        e = smol_imatrix.entries[name]
        assert e.counts.tolist() == [count], name
        ours, theirs = e.sums[0].astype(np.float64), ref[name].astype(np.float64)
        rel = np.abs(ours - theirs) / theirs
        assert np.median(rel) < REL_MEDIAN and np.corrcoef(ours, theirs)[0, 1] > 0.999, (name, np.median(rel))


def test_layer0_inputs_recomputed(smol_imatrix, smollm2_path):
    """blk.0's q, k and v read rmsnorm(token embedding) * attn_norm: their column sums of squares,
    recomputed in numpy from the file's tensors over the same chunks."""
    model = E.Model(smollm2_path)
    chunks, _ = text_chunks(model, TEXT.read_bytes(), 128, 3)
    r = GGUFReader(smollm2_path)
    t = {x.name: x for x in r.tensors}
    emb = gguf.quants.dequantize(np.asarray(t["token_embd.weight"].data), t["token_embd.weight"].tensor_type)
    emb = emb.reshape(-1, 576).astype(np.float64)
    gamma = np.asarray(t["blk.0.attn_norm.weight"].data, dtype=np.float64)
    x = emb[np.concatenate(chunks)]
    xn = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * gamma
    want = (xn * xn).sum(axis=0)
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"):
        np.testing.assert_allclose(smol_imatrix.entries[name].sums[0], want, rtol=1e-4, err_msg=name)


def test_collect_errors(smollm2_path, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("A few words.")
    r = subprocess.run([sys.executable, "-m", "ember.imatrix", "-m", smollm2_path, "-f", str(short), "-c", "128"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "fewer than n_ctx 128: need at least one chunk" in r.stderr
    r = subprocess.run([sys.executable, "-m", "ember.imatrix", "-m", smollm2_path, "-f", str(TEXT), "--chunks", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "--chunks must be a number of chunks >= 1" in r.stderr
    model = E.Model(smollm2_path)
    with pytest.raises(ValueError, match="fewer than n_ctx"):
        imatrix.collect(model, b"A few words.", 128)
    # a failed collection leaves nothing recording: a later context runs unobserved
    E.Context(model, n_ctx=32).eval(list(range(1, 20)))
    assert E.imatrix_stop() == {}
