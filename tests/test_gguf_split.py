"""Split GGUF models (llama-gguf-split's format): a model given by its first shard loads every shard and
gives the whole file's logits (mmap and use_mmap=False), ember-gguf-split and ember-quantize write
shards byte for byte as llama-gguf-split does (reference shards in tests/reference/gguf_split), merge
gives back the file, and every broken split is refused naming the file."""
import filecmp
import gzip
import importlib.util
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, rng_for
from ember import _ember as E
from ember import gguf_split

_spec = importlib.util.spec_from_file_location("synthetic_gguf", ROOT / "tools" / "synthetic_gguf.py")
synthetic_gguf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic_gguf)

# whole.gguf, and llama-gguf-split --split-max-tensors 2 of it: llama-split-0000k-of-00003.gguf
LLAMA_SPLIT = ROOT / "tests" / "reference" / "gguf_split"


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """A tiny llama with SmolLM2's tokenizer and fresh random weights."""
    d = tmp_path_factory.mktemp("split")
    vocab = d / "vocab.gguf"
    vocab.write_bytes(gzip.decompress((ROOT / "tests" / "fuzz" / "vocab" / "smollm2.gguf.gz").read_bytes()))
    out = str(d / "tiny.gguf")
    synthetic_gguf.write_model(out, "llama-tiny", str(vocab), ctx=256, seed=int(rng_for("split model").integers(2**31)))
    return out


def three_way(path: str) -> int:
    n = len(E.GGUFFile(path).tensors())
    return -(-n // 3)


@pytest.fixture(scope="module")
def shards(whole, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("shards") / "tiny")
    return gguf_split.split(whole, prefix, max_tensors=three_way(whole))


def logits(path: str, ids, **params) -> np.ndarray:
    ctx = E.Context(E.Model(path, **params), n_ctx=64, n_threads=2)
    ctx.eval(ids, logits_all=True)
    return np.asarray(ctx.all_logits(), dtype=np.float32)


def tensor_bytes(path: str) -> dict:
    f = E.GGUFFile(path)
    return {t["name"]: (t["type"], tuple(t["ne"]), bytes(f.tensor_data(t["name"]))) for t in f.tensors()}


def test_three_shards_load_with_the_whole_files_logits(whole, shards, rng):
    assert [p.rsplit("-", 3)[1:] for p in shards] == [["00001", "of", "00003.gguf"], ["00002", "of", "00003.gguf"],
                                                     ["00003", "of", "00003.gguf"]]
    f = E.GGUFFile(shards[0])
    assert f.split_paths == shards
    assert tensor_bytes(shards[0]) == tensor_bytes(whole)
    for k, p in enumerate(shards[1:], 1):   # later shards: the split keys and their tensors only
        assert E.GGUFFile(p, whole_model=False).metadata() == {"split.no": k, "split.tensors.count": len(f.tensors()),
                                                               "split.count": 3}
    ids = rng.integers(0, 49152, 12).tolist()
    ref = logits(whole, ids)
    np.testing.assert_array_equal(logits(shards[0], ids), ref)
    np.testing.assert_array_equal(logits(shards[0], ids, use_mmap=False), ref)
    text = "Split files load as one model."
    assert E.Tokenizer.from_gguf_file(shards[0]).encode(text) == E.Tokenizer.from_gguf_file(whole).encode(text)


def test_merge_gives_back_the_file(whole, shards, tmp_path):
    out = str(tmp_path / "merged.gguf")
    assert gguf_split.merge(shards[0], out) == out
    assert filecmp.cmp(out, whole, shallow=False)
    with pytest.raises(FileExistsError, match="merged.gguf: already exists"):
        gguf_split.merge(shards[0], out)


def test_split_and_merge_match_llama_gguf_split(tmp_path):
    """Shards written by llama-gguf-split load; ember's split of the same file is the same bytes; ember's
    merge of llama.cpp's shards is the original file."""
    ref = sorted(str(p) for p in LLAMA_SPLIT.glob("llama-split-*.gguf"))
    assert len(ref) == 3
    assert E.GGUFFile(ref[0]).split_paths == ref
    assert tensor_bytes(ref[0]) == tensor_bytes(str(LLAMA_SPLIT / "whole.gguf"))
    mine = gguf_split.split(str(LLAMA_SPLIT / "whole.gguf"), str(tmp_path / "llama-split"), max_tensors=2)
    for a, b in zip(mine, ref):
        assert filecmp.cmp(a, b, shallow=False), a
    merged = gguf_split.merge(ref[0], str(tmp_path / "merged.gguf"))
    assert filecmp.cmp(merged, LLAMA_SPLIT / "whole.gguf", shallow=False)


def test_merged_by_llama_cpp_split_count_zero_is_one_file(tmp_path):
    """llama-gguf-split --merge leaves split.count 0 in its output: one file."""
    src = E.GGUFFile(str(LLAMA_SPLIT / "whole.gguf"))
    path = str(tmp_path / "merged-00001-of-00003.gguf")
    w = E.GGUFWriter(path)
    w.set("split.no", 0, "uint16")
    w.set("split.count", 0, "uint16")
    w.set("split.tensors.count", len(src.tensors()), "int32")
    for t in src.tensors():
        w.add_tensor_info(t["name"], t["type"], t["ne"])
    w.write_header()
    for t in src.tensors():
        w.write_tensor_data(src.tensor_data(t["name"]))
    w.finish()
    assert tensor_bytes(path) == tensor_bytes(str(LLAMA_SPLIT / "whole.gguf"))


def test_quantize_writes_shards(whole, tmp_path):
    one = str(tmp_path / "q.gguf")
    assert E.quantize_model(whole, one, "Q8_0", n_threads=2) == [one]
    paths = E.quantize_model(whole, str(tmp_path / "qs.gguf"), "Q8_0", n_threads=2,
                             split_max_tensors=three_way(whole))
    assert paths == [str(tmp_path / f"qs-0000{k}-of-00003.gguf") for k in (1, 2, 3)]
    assert tensor_bytes(paths[0]) == tensor_bytes(one)
    merged = gguf_split.merge(paths[0], str(tmp_path / "merged.gguf"))
    assert filecmp.cmp(merged, one, shallow=False)
    # A size limit: no shard's tensors past it, except a tensor larger than the limit alone in its shard.
    limit = 3_000_000
    paths = E.quantize_model(whole, str(tmp_path / "qz.gguf"), "Q8_0", n_threads=2, split_max_bytes=limit)
    assert len(paths) > 1 and tensor_bytes(paths[0]) == tensor_bytes(one)
    for p in paths:
        sizes = [-(-t["nbytes"] // 32) * 32 for t in E.GGUFFile(p, whole_model=False).tensors()]
        assert sum(sizes) <= limit or len(sizes) == 1


def test_quantize_cli_split(whole, tmp_path):
    r = subprocess.run([sys.executable, "-m", "ember.quantize", whole, str(tmp_path / "c.gguf"), "Q8_0", "-q",
                        "--split-max-tensors", str(three_way(whole))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote 3 shards" in r.stderr and (tmp_path / "c-00003-of-00003.gguf").exists()
    r = subprocess.run([sys.executable, "-m", "ember.quantize", whole, str(tmp_path / "d.gguf"), "Q8_0",
                        "--split-max-tensors", "2", "--split-max-size", "1G"], capture_output=True, text=True)
    assert r.returncode == 2 and "not allowed with argument" in r.stderr


def test_plan_rule():
    assert gguf_split.plan([10, 10, 10, 10, 10], max_tensors=2) == [0, 0, 1, 1, 2]
    # Padded to 32: 32 + 32 fit 64, the third does not; 100 alone passes the limit and stands alone.
    assert gguf_split.plan([1, 30, 5, 100, 3], max_bytes=64) == [0, 0, 1, 2, 3]
    assert gguf_split.plan([], max_tensors=1) == []


def test_cli_split_merge_and_options(whole, tmp_path):
    run = [sys.executable, "-m", "ember.gguf_split"]
    r = subprocess.run(run + ["--split-max-size", "40M", "--no-tensor-first-split", whole, str(tmp_path / "m")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    first = E.GGUFFile(str(tmp_path / "m-00001-of-00003.gguf"))
    assert len(first.split_paths) == 3 and tensor_bytes(first.path) == tensor_bytes(whole)
    assert E.GGUFFile(first.path, whole_model=False).tensors() == []
    r = subprocess.run(run + ["--merge", first.path, str(tmp_path / "back.gguf")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert filecmp.cmp(tmp_path / "back.gguf", whole, shallow=False)
    r = subprocess.run(run + ["--dry-run", "--split-max-tensors", "1", whole, str(tmp_path / "n")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "would write" in r.stderr and not list(tmp_path.glob("n-*"))
    for bad, message in [(["--split-max-size", "12K"], "invalid size '12K'"),
                         (["--split-max-size", "0M"], "invalid size '0M'"),
                         (["--split-max-tensors", "0"], "must be at least 1"),
                         (["--split-max-tensors", "2", "--split-max-size", "1G"], "not allowed with argument"),
                         (["--split", "--merge"], "not allowed with argument")]:
        r = subprocess.run(run + bad + [whole, str(tmp_path / "x")], capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (bad, r.stderr)
    r = subprocess.run(run + ["--split-max-size", "40M", "--no-tensor-first-split", whole, str(tmp_path / "m")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "m-00001-of-00003.gguf: already exists; not overwriting it" in r.stderr


# Broken splits, made from the reference shards.
def copy_shards(tmp_path, prefix="m"):
    out = []
    for k, src in enumerate(sorted(LLAMA_SPLIT.glob("llama-split-*.gguf"))):
        dst = tmp_path / f"{prefix}-{k + 1:05d}-of-00003.gguf"
        shutil.copy(src, dst)
        out.append(str(dst))
    return out


def rewrite(path: str, **keys) -> None:
    """The shard at path again, with its split keys set as given (None: dropped) or extra tensors."""
    src = E.GGUFFile(path, whole_model=False)
    extra = keys.pop("extra_tensors", [])
    md = src.metadata()
    types = {k: src.key_type(k) for k in md}
    for k, v in keys.items():
        md[k.replace("_", ".")] = v
    tensors = [(t["name"], t["type"], t["ne"], bytes(src.tensor_data(t["name"]))) for t in src.tensors()] + extra
    del src
    w = E.GGUFWriter(path)
    for k, v in md.items():
        if v is not None:
            w.set(k, v, gguf_split._leaf_type(types.get(k, "uint16")))
    for name, type_id, ne, _ in tensors:
        w.add_tensor_info(name, type_id, ne)
    w.write_header()
    for *_, data in tensors:
        w.write_tensor_data(data)
    w.finish()


def test_missing_shard(tmp_path):
    paths = copy_shards(tmp_path)
    (tmp_path / "m-00003-of-00003.gguf").unlink()
    with pytest.raises(ValueError, match=r"m-00001-of-00003.gguf: missing shard '.*m-00003-of-00003.gguf' "
                                         r"\(shard 3 of the 3 its split.count names\)"):
        E.GGUFFile(paths[0])


def test_not_the_first_shard(tmp_path):
    paths = copy_shards(tmp_path)
    for open_ in (E.GGUFFile, E.Model, E.Tokenizer.from_gguf_file):
        with pytest.raises(ValueError, match=r"m-00002-of-00003.gguf: this is shard 2 of 3 of a split model; give "
                                             r"its first shard '.*m-00001-of-00003.gguf'"):
            open_(paths[1])
    assert E.GGUFFile(paths[1], whole_model=False).metadata()["split.no"] == 1


def test_split_count_disagrees(tmp_path):
    paths = copy_shards(tmp_path)
    rewrite(paths[2], split_count=4)
    with pytest.raises(ValueError, match=r"m-00003-of-00003.gguf: split.count is 4 but the first shard "
                                         r"'.*m-00001-of-00003.gguf' says 3"):
        E.GGUFFile(paths[0])


def test_split_no_disagrees_with_the_name(tmp_path):
    paths = copy_shards(tmp_path)
    rewrite(paths[1], split_no=2)
    with pytest.raises(ValueError, match=r"m-00002-of-00003.gguf: split.no is 2 but its name makes it shard 1"):
        E.GGUFFile(paths[0])


def test_tensor_count_does_not_add_up(tmp_path):
    paths = copy_shards(tmp_path)
    rewrite(paths[0], split_tensors_count=7)
    with pytest.raises(ValueError, match=r"m-00001-of-00003.gguf: split.tensors.count says the model has 7 tensors "
                                         r"but its 3 shards hold 5"):
        E.GGUFFile(paths[0])


def test_duplicate_tensor_across_shards(tmp_path):
    paths = copy_shards(tmp_path)
    first = E.GGUFFile(paths[0], whole_model=False)
    t = first.tensors()[0]
    dup = (t["name"], t["type"], t["ne"], bytes(first.tensor_data(t["name"])))
    del first
    rewrite(paths[2], extra_tensors=[dup])
    with pytest.raises(ValueError, match=rf"m-00003-of-00003.gguf: tensor '{t['name']}' is also in shard "
                                         r"'.*m-00001-of-00003.gguf' \(duplicate tensor name\)"):
        E.GGUFFile(paths[0])


def test_first_shard_renamed(tmp_path):
    paths = copy_shards(tmp_path)
    renamed = tmp_path / "model.gguf"
    shutil.move(paths[0], renamed)
    with pytest.raises(ValueError, match=r"model.gguf: this is the first of 3 shards of a split model, but its name "
                                         r"does not end in '-00001-of-00003.gguf'"):
        E.GGUFFile(str(renamed))
