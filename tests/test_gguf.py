"""GGUF reader/writer: compared with the `gguf` PyPI package on the real SmolLM2 file, rejected
corruptions of that file, resident memory of a load, and writer round trips read by both readers."""
import os
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

from ember import _ember

GT = gguf.GGUFValueType


# ---------------------------------------------------------------- reading the real file

@pytest.fixture(scope="module")
def ref(smollm2_path):
    return gguf.GGUFReader(smollm2_path)


def _same_value(got, expected, types):
    """Compare an ember metadata value with gguf-py's contents(); float32 values compared as float32."""
    if types[-1] == GT.FLOAT32:
        return np.array_equal(np.asarray(got, dtype=np.float32), np.asarray(expected, dtype=np.float32))
    return got == expected


def _type_string(types):
    names = [gguf.GGUFValueType(t).name.lower() for t in types]
    return "".join(f"{n}[" for n in names[:-1]) + names[-1] + "]" * (len(names) - 1)


def test_metadata_matches_gguf_package(smollm2_path, ref):
    f = _ember.GGUFFile(smollm2_path)
    assert f.path == smollm2_path
    assert f.version == 3
    assert f.alignment == ref.alignment == 32
    assert f.file_size == os.path.getsize(smollm2_path)
    md = f.metadata()
    fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(md) == list(fields)  # same keys, same order
    for key, field in fields.items():
        assert _same_value(md[key], field.contents(), field.types), key
        assert f.key_type(key) == _type_string(field.types), key
    assert len(md["tokenizer.ggml.tokens"]) == 49152


def test_tensors_match_gguf_package(smollm2_path, ref):
    f = _ember.GGUFFile(smollm2_path)
    tensors = f.tensors()
    assert len(tensors) == len(ref.tensors) == 272
    for mine, theirs in zip(tensors, ref.tensors):
        assert mine["name"] == theirs.name
        assert mine["type"] == int(theirs.tensor_type)
        assert mine["ne"] == [int(d) for d in theirs.shape]
        assert mine["offset"] + ref.data_offset == theirs.data_offset
        assert mine["nbytes"] == theirs.n_bytes
        data = f.tensor_data(mine["name"])
        assert data.dtype == np.uint8 and data.shape == (theirs.n_bytes,)
        assert np.array_equal(data, np.ascontiguousarray(theirs.data).view(np.uint8).reshape(-1)), mine["name"]


def test_tensor_data_is_a_read_only_view_that_keeps_the_file_alive(smollm2_path):
    f = _ember.GGUFFile(smollm2_path)
    t0, t1 = f.tensors()[:2]
    a, b = f.tensor_data(t0["name"]), f.tensor_data(t1["name"])
    assert not a.flags.writeable
    # Both views point into one mapping: their addresses differ exactly by the offsets.
    addr = lambda x: x.__array_interface__["data"][0]  # noqa: E731
    assert addr(b) - addr(a) == t1["offset"] - t0["offset"]
    expected = bytes(a[:64])
    del f
    assert bytes(a[:64]) == expected
    with pytest.raises(ValueError):
        a[0] = 1


def test_getters_and_missing_key(smollm2_path):
    f = _ember.GGUFFile(smollm2_path)
    assert f.get_uint("llama.block_count") == 30
    assert f.get_int("llama.block_count") == 30
    assert f.get_float("llama.block_count") == 30.0
    assert f.get_float("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert f.get_string("general.architecture") == "llama"
    assert f.get_bool("tokenizer.ggml.add_bos_token") is False
    assert f.get_uint("llama.not_a_key", 7) == 7
    assert f.get_string("llama.not_a_key", "x") == "x"
    with pytest.raises(ValueError) as e:
        f.get_uint("llama.not_a_key")
    assert "missing required key 'llama.not_a_key'" in str(e.value) and smollm2_path in str(e.value)
    with pytest.raises(ValueError, match=r"general.architecture.*string.*expected an unsigned"):
        f.get_uint("general.architecture")
    with pytest.raises(ValueError, match="expected string"):
        f.get_string("llama.block_count")
    with pytest.raises(ValueError, match="missing tensor 'nope'"):
        f.tensor_data("nope")


def test_version_2_is_read(smollm2_path, ref, tmp_path):
    p = _corrupt_copy(smollm2_path, ref, tmp_path, "v2.gguf", [(4, struct.pack("<I", 2))])
    f = _ember.GGUFFile(str(p))
    assert f.version == 2 and len(f.tensors()) == 272


def test_load_does_not_grow_resident_memory_by_the_file_size(smollm2_path):
    script = (
        "import sys\n"
        "from ember import _ember\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS:'): return int(line.split()[1]) * 1024\n"
        "before = rss()\n"
        "f = _ember.GGUFFile(sys.argv[1])\n"
        "n = len(f.tensors()); f.get_uint('llama.block_count')\n"
        "print(rss() - before, n)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, smollm2_path], check=True, capture_output=True,
                         text=True, env=os.environ.copy()).stdout.split()
    growth, n = int(out[0]), int(out[1])
    size = os.path.getsize(smollm2_path)
    print(f"VmRSS growth {growth / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file")
    assert n == 272
    assert growth < size // 5


# ---------------------------------------------------------------- corrupt copies of the real file

def _corrupt_copy(src, ref, tmp_path, name, patches, size=None):
    """Copy the header region (everything before the data section) of `src` to tmp_path/name, apply
    (offset, bytes) patches, and extend it sparsely to `size` (default: the real file size)."""
    with open(src, "rb") as fh:
        header = bytearray(fh.read(ref.data_offset))
    for off, data in patches:
        header[off:off + len(data)] = data
    full = os.path.getsize(src) if size is None else size
    p = tmp_path / name
    with open(p, "wb") as fh:
        fh.write(header[:full])
        fh.truncate(full)
    return p


def _part_offset(field, i):
    return field.offset + sum(int(p.nbytes) for p in field.parts[:i])


def _tensor_part(ref, idx, part):
    return _part_offset(ref.tensors[idx].field, part)   # parts: name_len, name, n_dims, dims, type, offset


def _key_part(ref, key, part):
    return _part_offset(ref.fields[key], part)          # parts: key_len, key, type, value parts...


U32, U64 = (lambda v: struct.pack("<I", v)), (lambda v: struct.pack("<Q", v))


def _cases(ref):
    t0, t1, last = ref.tensors[0], ref.tensors[1], ref.tensors[-1]
    q_idx = next(i for i, t in enumerate(ref.tensors) if t.tensor_type == gguf.GGMLQuantizationType.Q4_1)
    two_d = next(i for i, t in enumerate(ref.tensors) if len(t.shape) == 2)
    # two tensors whose names have the same length: the second is renamed to the first
    di, dj = next((i, j) for j in range(1, len(ref.tensors)) for i in range(j)
                  if len(ref.tensors[i].name) == len(ref.tensors[j].name))
    return {
        # name: (patches, size, words expected in the message)
        "empty": ([], 0, ["truncated"]),
        "trunc_magic": ([], 3, ["truncated"]),
        "trunc_header": ([], 20, ["truncated", "metadata count"]),
        "trunc_tokens": ([], 500_000, ["truncated", "tokenizer.ggml.tokens"]),
        "trunc_merges": ([], 1_000_000, ["truncated", "tokenizer.ggml.merges"]),
        "trunc_tensor_infos": ([], _tensor_part(ref, 3, 1) + 5, ["truncated", "tensor info #3"]),
        "trunc_data": ([], ref.data_offset + 4096, ["outside", t0.name]),
        "bad_magic": ([(0, b"GGUX")], None, ["magic"]),
        "version_1": ([(4, U32(1))], None, ["version 1", "not supported"]),
        "version_99": ([(4, U32(99))], None, ["unsupported", "version 99"]),
        "string_len": ([(_key_part(ref, "general.name", 3), U64(1 << 40))], None,
                       ["string length", "general.name", "past the end"]),
        "key_len": ([(_key_part(ref, "general.type", 0), U64(1 << 62))], None, ["string length", "key #"]),
        "array_count": ([(_key_part(ref, "tokenizer.ggml.token_type", 4), U64(1 << 40))], None,
                        ["array count", "tokenizer.ggml.token_type"]),
        "huge_n_tensors": ([(8, U64(1 << 60))], None, ["n_tensors"]),
        "huge_n_kv": ([(16, U64(1 << 60))], None, ["n_kv"]),
        "value_type": ([(_key_part(ref, "llama.block_count", 2), U32(13))], None,
                       ["unknown value type 13", "llama.block_count"]),
        "array_elem_type": ([(_key_part(ref, "general.languages", 3), U32(77))], None,
                            ["array of unknown value type 77", "general.languages"]),
        "tensor_type": ([(_tensor_part(ref, 1, 4), U32(99))], None, ["unknown tensor type 99", t1.name]),
        "offset_outside": ([(_tensor_part(ref, len(ref.tensors) - 1, 5), U64(1 << 40))], None,
                           ["outside", last.name]),
        "overlap": ([(_tensor_part(ref, 1, 5), U64(int(t0.data_offset - ref.data_offset) + 32))], None,
                    ["overlap", t0.name, t1.name]),
        "misaligned": ([(_tensor_part(ref, 1, 5), U64(int(t1.data_offset - ref.data_offset) + 4))], None,
                       ["not aligned", t1.name]),
        "n_dims": ([(_tensor_part(ref, 1, 2), U32(5))], None, ["n_dims=5", t1.name]),
        "dims_overflow": ([(_tensor_part(ref, two_d, 3), U64(1 << 32) + U64(1 << 32))], None,
                          ["overflows", ref.tensors[two_d].name]),
        "dim_zero": ([(_tensor_part(ref, 1, 3), U64(0))], None, ["dimension ne[0]=0", t1.name]),
        "block_size": ([(_tensor_part(ref, q_idx, 3), U64(33))], None,
                       ["not a multiple of the block size 32", ref.tensors[q_idx].name]),
        # llama.block_count (=30) renamed to general.alignment: same key length, not a power of two
        "bad_alignment": ([(_key_part(ref, "llama.block_count", 1), b"general.alignment")], None,
                          ["general.alignment", "power-of-two"]),
        "duplicate_key": ([(_key_part(ref, "general.file_type", 1), b"llama.block_count")], None,
                          ["duplicate metadata key 'llama.block_count'"]),
        "duplicate_tensor": ([(_tensor_part(ref, dj, 1), ref.tensors[di].name.encode())], None,
                             [f"duplicate tensor name '{ref.tensors[di].name}'"]),
    }


def test_corruptions_are_rejected(smollm2_path, ref, tmp_path):
    cases = _cases(ref)
    assert len(cases) >= 15
    for name, (patches, size, words) in cases.items():
        p = _corrupt_copy(smollm2_path, ref, tmp_path, f"corrupt_{name}.gguf", patches, size)
        with pytest.raises(ValueError) as e:
            _ember.GGUFFile(str(p))
        msg = str(e.value)
        assert str(p) in msg, (name, msg)
        for w in words:
            assert w in msg, (name, w, msg)


def test_random_garbage_never_crashes(smollm2_path, ref, tmp_path, rng):
    """Random byte flips in the header region: each load either succeeds or raises ValueError."""
    with open(smollm2_path, "rb") as fh:
        head = fh.read(ref.data_offset)
    # Flip bytes only in the parts with structure (fixed header, small keys, tensor infos).
    regions = [(0, 1062), (1768872, ref.data_offset)]
    p = tmp_path / "garbage.gguf"
    for _ in range(40):
        buf = bytearray(head)
        for _ in range(rng.integers(1, 6)):
            lo, hi = regions[rng.integers(len(regions))]
            buf[rng.integers(lo, hi)] = rng.integers(256)
        with open(p, "wb") as fh:
            fh.write(buf)
            fh.truncate(os.path.getsize(smollm2_path))
        try:
            _ember.GGUFFile(str(p))
        except ValueError as e:
            assert str(p) in str(e)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ValueError, match="cannot open"):
        _ember.GGUFFile(str(tmp_path / "nope.gguf"))
    with pytest.raises(ValueError, match="not a regular file"):
        _ember.GGUFFile(str(tmp_path))


# ---------------------------------------------------------------- writer round trips

def _random_metadata(rng):
    """(key, value, type name or None, expected ember value, gguf-py value type list)."""
    r = lambda lo, hi: int(rng.integers(lo, hi))  # noqa: E731
    f32 = float(np.float32(rng.standard_normal()))
    words = ["héllo", "wörld", "", "tokens ✓", "a\nb"]
    ints = [r(-2**31, 2**31) for _ in range(7)]
    floats = [float(np.float32(x)) for x in rng.standard_normal(5)]
    return [
        ("test.u8", r(0, 256), "uint8", None, [GT.UINT8]),
        ("test.i8", r(-128, 128), "int8", None, [GT.INT8]),
        ("test.u16", r(0, 2**16), "uint16", None, [GT.UINT16]),
        ("test.i16", r(-2**15, 2**15), "int16", None, [GT.INT16]),
        ("test.u32", r(0, 2**32), "uint32", None, [GT.UINT32]),
        ("test.i32", r(-2**31, 2**31), "int32", None, [GT.INT32]),
        ("test.u64", 2**63 + r(0, 2**62), "uint64", None, [GT.UINT64]),
        ("test.u64_inferred", 2**64 - 1 - r(0, 1000), None, None, [GT.UINT64]),
        ("test.i64", -r(1, 2**62), None, None, [GT.INT64]),
        ("test.f32", f32, None, None, [GT.FLOAT32]),
        ("test.f64", float(rng.standard_normal()), "float64", None, [GT.FLOAT64]),
        ("test.f32_from_int", 3, "float32", 3.0, [GT.FLOAT32]),
        ("test.bool_t", True, None, None, [GT.BOOL]),
        ("test.bool_f", False, None, None, [GT.BOOL]),
        ("test.str", words[r(0, len(words))] + str(r(0, 1000)), None, None, [GT.STRING]),
        ("test.arr_i32", ints, "int32", None, [GT.ARRAY, GT.INT32]),
        ("test.arr_i64", ints, None, None, [GT.ARRAY, GT.INT64]),
        ("test.arr_f32", floats, None, None, [GT.ARRAY, GT.FLOAT32]),
        ("test.arr_f64_np", np.asarray(floats, dtype=np.float64), "float64", floats, [GT.ARRAY, GT.FLOAT64]),
        ("test.arr_str", words, None, None, [GT.ARRAY, GT.STRING]),
        ("test.arr_bool", [bool(b) for b in rng.integers(0, 2, 6)], None, None, [GT.ARRAY, GT.BOOL]),
        ("test.arr_empty", [], "uint16", None, [GT.ARRAY, GT.UINT16]),
        ("test.nested", [ints[:3], ints[3:], []], "int32", None, [GT.ARRAY, GT.ARRAY, GT.INT32]),
        ("test.nested_str", [[words[0]], [words[1], words[3]]], None, None, [GT.ARRAY, GT.ARRAY, GT.STRING]),
        ("test.bytes", b"raw bytes", None, "raw bytes", [GT.STRING]),
    ]


def _random_tensors(rng):
    """(name, ggml type id, ne, raw bytes)."""
    f32 = rng.standard_normal((3, 64)).astype(np.float32)        # ne = [64, 3]
    f16 = rng.standard_normal((2, 5, 32)).astype(np.float16)     # ne = [32, 5, 2]
    q8_0 = rng.integers(0, 256, 2 * 2 * 34, dtype=np.uint8)      # ne = [64, 2]: 2 blocks of 34 bytes per row
    q4_k = rng.integers(0, 256, 3 * 144, dtype=np.uint8)         # ne = [256, 3]: 1 block of 144 bytes per row
    q4_1 = rng.integers(0, 256, 7 * 20, dtype=np.uint8)          # ne = [32, 7]: 1 block of 20 bytes per row
    return [
        ("t.f32", 0, [64, 3], f32),
        ("t.f16", 1, [32, 5, 2], f16),
        ("t.q8_0", 8, [64, 2], q8_0),
        ("t.q4_k", 12, [256, 3], q4_k),
        ("t.q4_1", 3, [32, 7, 1, 1], q4_1.tobytes()),
    ]


def _write(path, meta, tensors, alignment=32):
    w = _ember.GGUFWriter(str(path), alignment) if alignment != 32 else _ember.GGUFWriter(str(path))
    for key, value, type_name, _, _ in meta:
        w.set(key, value, type_name) if type_name else w.set(key, value)
    for name, type_id, ne, _ in tensors:
        w.add_tensor_info(name, type_id, ne)
    w.write_header()
    for _, _, _, data in tensors:
        w.write_tensor_data(data)
    w.finish()


def _as_bytes(data):
    return data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes()


@pytest.mark.parametrize("alignment", [32, 64, 4096])
def test_writer_round_trip(tmp_path, alignment, rng):
    meta, tensors = _random_metadata(rng), _random_tensors(rng)
    path = tmp_path / f"rt_{alignment}.gguf"
    _write(path, meta, tensors, alignment)

    # gguf-py (reference reader)
    r = gguf.GGUFReader(path)
    assert r.alignment == alignment
    for key, value, _, expected, types in meta:
        expected = value if expected is None else expected
        field = r.fields[key]
        if len(types) > 1 and len(expected) == 0:
            # gguf-py takes element types from element 0; read the array header parts instead
            _, _, _, elem_type, count = field.parts
            assert (int(elem_type[0]), int(count[0])) == (types[1], 0), key
            continue
        assert field.types[0] == types[0] and field.types[-1] == types[-1], key
        if len(types) == 2 and expected:
            assert _same_value(field.contents(), list(expected), types), key
        elif len(types) == 1:
            assert _same_value(field.contents(), expected, types), key
    assert [t.name for t in r.tensors] == [t[0] for t in tensors]
    for (name, type_id, ne, data), t in zip(tensors, r.tensors):
        assert int(t.tensor_type) == type_id and [int(d) for d in t.shape] == ne
        assert t.data_offset % alignment == 0
        assert np.ascontiguousarray(t.data).tobytes() == _as_bytes(data), name

    # ember's reader
    f = _ember.GGUFFile(str(path))
    assert f.version == 3 and f.alignment == alignment
    md = f.metadata()
    for key, value, _, expected, types in meta:
        expected = value if expected is None else expected
        if isinstance(expected, np.ndarray):
            expected = expected.tolist()
        assert _same_value(md[key], expected, types), key
        assert f.key_type(key) == _type_string(types), key
    for (name, type_id, ne, data), t in zip(tensors, f.tensors()):
        assert (t["name"], t["type"], t["ne"]) == (name, type_id, ne)
        assert t["offset"] % alignment == 0
        assert f.tensor_data(name).tobytes() == _as_bytes(data)


def test_writer_rejects_misuse(tmp_path):
    w = _ember.GGUFWriter(str(tmp_path / "bad.gguf"))
    with pytest.raises(ValueError, match="does not fit in uint8"):
        w.set("k.u8", 300, "uint8")
    with pytest.raises(ValueError, match="negative"):
        w.set("k.u32", -1, "uint32")
    with pytest.raises(ValueError, match="unknown type name"):
        w.set("k", 1, "uint128")
    with pytest.raises(ValueError, match="mixes"):
        w.set("k.mixed", [1, "a"])
    with pytest.raises(ValueError, match="empty list"):
        w.set("k.empty", [])
    with pytest.raises(ValueError, match="unknown tensor type 99"):
        w.add_tensor_info("t", 99, [32])
    with pytest.raises(ValueError, match="block size 32"):
        w.add_tensor_info("t", 2, [33])
    with pytest.raises(ValueError, match="dimensions"):
        w.add_tensor_info("t", 0, [1, 1, 1, 1, 1])
    w.add_tensor_info("a", 0, [4])
    w.add_tensor_info("b", 0, [2, 2])
    with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
        w.add_tensor_info("a", 0, [4])
    with pytest.raises(ValueError, match="before write_header"):
        w.write_tensor_data(b"\0" * 16)
    w.write_header()
    with pytest.raises(ValueError, match="after write_header"):
        w.set("k", 1)
    with pytest.raises(ValueError, match="after write_header"):
        w.add_tensor_info("c", 0, [4])
    with pytest.raises(ValueError, match=r"tensor 'a' data has 12 bytes, expected 16"):
        w.write_tensor_data(np.zeros(3, np.float32))
    w.write_tensor_data(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="only 1 of 2 tensors"):
        w.finish()
    w.write_tensor_data(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match="already written"):
        w.write_tensor_data(b"\0" * 16)
    w.finish()
    assert [t["name"] for t in _ember.GGUFFile(str(tmp_path / "bad.gguf")).tensors()] == ["a", "b"]
    with pytest.raises(ValueError, match="power of two"):
        _ember.GGUFWriter(str(tmp_path / "x.gguf"), 48)
    with pytest.raises(ValueError, match="cannot open"):
        _ember.GGUFWriter(str(tmp_path / "no_dir" / "x.gguf"))
