"""ember-quantize --imatrix records its importance matrix as llama-quantize does: quantize.imatrix.file (the path
as given), .dataset (the file's first dataset), .entries_count (the entries read, also those of tensors the model
lacks) and .chunks_count, after the input's keys and general.quantization_version and general.file_type (in its
order, so that the files' keys come in the same order), strings cut to 127 bytes; none without --imatrix, and a key the
input already holds is replaced."""
import gguf
import numpy as np
from gguf import GGUFReader

from conftest import rng_for
from ember import imatrix as im
from ember.quantize import main

KEYS = ["quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
        "quantize.imatrix.chunks_count"]


def write_model(path, rng, old_keys=False):
    w = gguf.GGUFWriter(str(path), "llama")
    if old_keys:   # a file quantized before with another matrix
        w.add_string("quantize.imatrix.file", "old.gguf")
        w.add_uint32("quantize.imatrix.chunks_count", 7)
    w.add_string("general.name", "tiny")
    w.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((4, 256)).astype(np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", rng.standard_normal(256).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_imatrix(path, rng, datasets, chunks):
    entries = {name: im.Entry(rng.uniform(0.5, 2.0, (1, 256)).astype(np.float32), np.array([64]))
               for name in ("blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "blk.0.attn_q.weight")}
    im.write(str(path), im.Imatrix(entries, datasets, chunks, 512))


def fields(path):
    r = GGUFReader(str(path))
    return list(r.fields), {k: f.contents() for k, f in r.fields.items() if k.startswith("quantize.")}


def test_keys_as_llama_quantize(tmp_path):
    rng = rng_for("imatrix keys")
    write_model(tmp_path / "f32.gguf", rng)
    write_imatrix(tmp_path / "im.gguf", rng, ["wiki.train.raw", "other.txt"], 29)
    assert main([str(tmp_path / "f32.gguf"), str(tmp_path / "q.gguf"), "Q4_K_M", "--imatrix",
                 str(tmp_path / "im.gguf"), "-q", "-t", "2"]) == 0
    order, got = fields(tmp_path / "q.gguf")
    assert got == {KEYS[0]: str(tmp_path / "im.gguf"), KEYS[1]: "wiki.train.raw", KEYS[2]: 3, KEYS[3]: 29}
    assert order[-6:] == ["general.quantization_version", "general.file_type"] + KEYS
    assert GGUFReader(str(tmp_path / "q.gguf")).fields[KEYS[2]].types == [gguf.GGUFValueType.UINT32]


def test_long_dataset_cut_no_chunks_and_old_keys_replaced(tmp_path):
    rng = rng_for("imatrix keys old")
    write_model(tmp_path / "f32.gguf", rng, old_keys=True)
    write_imatrix(tmp_path / "im.gguf", rng, ["d" * 200], 0)
    assert main([str(tmp_path / "f32.gguf"), str(tmp_path / "q.gguf"), "Q8_0", "--imatrix",
                 str(tmp_path / "im.gguf"), "-q", "-t", "2"]) == 0
    order, got = fields(tmp_path / "q.gguf")
    # no chunk count in the matrix: the input's key stays where it was, as llama-quantize leaves it
    assert got == {KEYS[0]: str(tmp_path / "im.gguf"), KEYS[1]: "d" * 127, KEYS[2]: 3, KEYS[3]: 7}
    assert order[-3:] == KEYS[:3] and order.index(KEYS[3]) < order.index("general.name")


def test_no_keys_without_imatrix(tmp_path):
    write_model(tmp_path / "f32.gguf", rng_for("imatrix keys none"))
    assert main([str(tmp_path / "f32.gguf"), str(tmp_path / "q.gguf"), "Q8_0", "-q", "-t", "2"]) == 0
    assert fields(tmp_path / "q.gguf")[1] == {}
