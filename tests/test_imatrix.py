"""Importance-matrix files (ember.imatrix): the GGUF layout llama-imatrix writes (keys, tensor names,
shapes, order, no architecture), its older .dat format read into the same sums and counts, expert
(3-D) entries, and clear errors for files that are not imatrices or are cut short."""
import struct

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from ember import imatrix

from conftest import rng_for


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
        if t.name.endswith(".in_sum2"):   # ne = [n_in, n_mat]
            assert [int(x) for x in t.shape] == [e.sums.shape[1], e.sums.shape[0]]
        else:
            assert [int(x) for x in t.shape] == [1, e.sums.shape[0]]


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
