"""ember-convert (HF -> GGUF): tiny random Llama/Mistral/Qwen2 models and small tokenizers are
converted; ember's logits and tokens must match transformers' (tests/reference/hf, or live with
hf_live), the GGUF metadata and tensor layout must be what llama.cpp's format expects, and bad
input gives a one-line error."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")
pytest.importorskip("sentencepiece", reason="sentencepiece reads the SentencePiece tokenizer model")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402
from hf_tiny import hf_generator, hf_reference  # noqa: E402,F401 (fixtures)

from ember import _ember  # noqa: E402
from ember.convert import convert, main  # noqa: E402

T = gguf.GGMLQuantizationType
PROMPT = hf_tiny.SHORT_PROMPT

# The tiny models (tools/gen_hf_references.py says how each was made): name -> (architecture, tied).
MODELS = {
    "llama-untied-sharded-bf16": ("llama", False),
    "mistral-tied": ("mistral", True),
    "qwen2-untied-sharded-padded": ("qwen2", False),
}
# Tokenizer kinds -> the tokenizer transformers' reference ids were recorded for: "spm-json" is
# "spm" without tokenizer.model.
TOKENIZERS = {"bpe": "bpe", "spm": "spm", "spm-json": "spm"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (HF dir, config, float32 weights exactly as stored)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in MODELS:
        d = str(root / name)
        weights = hf_tiny.build(name, d)
        out[name] = (d, hf_tiny.models()[name]["config"], weights)
    return out


def _convert(hf_dir, tmp_path, outtype):
    path = str(tmp_path / f"model-{outtype}.gguf")
    convert(hf_dir, path, outtype, progress=False)
    return path


def _fields(reader):
    return {name: f.contents() for name, f in reader.fields.items()}


# ---------------------------------------------------------------------------------------- file


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
def test_metadata_and_tensor_types(models, tmp_path, name, outtype):
    hf_dir, cfg, _ = models[name]
    arch_name, tied = MODELS[name]
    arch = "qwen2" if arch_name == "qwen2" else "llama"
    path = _convert(hf_dir, tmp_path, outtype)
    r = gguf.GGUFReader(path)
    kv = _fields(r)
    assert kv["general.architecture"] == arch
    assert kv["general.name"] == name
    assert kv["general.file_type"] == {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[outtype]
    assert kv["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    assert kv[f"{arch}.context_length"] == cfg["max_position_embeddings"]
    assert kv[f"{arch}.embedding_length"] == 64
    assert kv[f"{arch}.block_count"] == 2
    assert kv[f"{arch}.feed_forward_length"] == 160
    assert kv[f"{arch}.attention.head_count"] == 4
    assert kv[f"{arch}.attention.head_count_kv"] == 2
    assert kv[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert kv[f"{arch}.rope.freq_base"] == pytest.approx(cfg["rope_parameters"]["rope_theta"])
    assert kv[f"{arch}.rope.dimension_count"] == 16
    assert kv[f"{arch}.vocab_size"] == cfg["vocab_size"]
    assert len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"]

    tensors = {t.name: t for t in r.tensors}
    assert ("output.weight" in tensors) == (not tied)
    n_expected = 2 + (not tied) + 2 * (9 + (3 if arch == "qwen2" else 0))
    assert len(tensors) == n_expected
    weight_type = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}[outtype]
    for t in r.tensors:
        if len(t.shape) == 1:
            assert t.tensor_type == T.F32, t.name   # norms and biases stay F32
        else:
            assert t.tensor_type == weight_type, t.name
    # GGUF dims are innermost first: token_embd is [n_embd, n_vocab].
    assert [int(x) for x in tensors["token_embd.weight"].shape] == [64, cfg["vocab_size"]]


@pytest.mark.parametrize("name", list(MODELS))
def test_qk_layout(models, tmp_path, name):
    """GGUF's llama layout pairs rotary dims as adjacent rows (2i, 2i+1) of each head, where HF pairs
    row i with row i + head_dim/2; qwen2 (NEOX rope) keeps HF's order. All other tensors are copied."""
    hf_dir, _, sd = models[name]
    path = _convert(hf_dir, tmp_path, "f32")
    tensors = {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in
               gguf.GGUFReader(path).tensors}
    for hf_name, g_name, heads in [("q_proj", "attn_q", 4), ("k_proj", "attn_k", 2)]:
        w = sd[f"model.layers.1.self_attn.{hf_name}.weight"]
        g = tensors[f"blk.1.{g_name}.weight"]
        if MODELS[name][0] == "qwen2":
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(tensors[f"blk.1.{g_name}.bias"],
                                          sd[f"model.layers.1.self_attn.{hf_name}.bias"])
            continue
        half = 16 // 2
        hf_pairs = w.reshape(heads, 2, half, 64)           # [head, which half, i, in]
        gg_pairs = g.reshape(heads, half, 2, 64)           # [head, i, pair member, in]
        np.testing.assert_array_equal(gg_pairs[:, :, 0], hf_pairs[:, 0])
        np.testing.assert_array_equal(gg_pairs[:, :, 1], hf_pairs[:, 1])
    np.testing.assert_array_equal(tensors["blk.0.ffn_down.weight"], sd["model.layers.0.mlp.down_proj.weight"])
    np.testing.assert_array_equal(tensors["output_norm.weight"], sd["model.norm.weight"])


def test_q8_0_matches_gguf_quantizer(models, tmp_path):
    hf_dir, _, sd = models["mistral-tied"]
    path = _convert(hf_dir, tmp_path, "q8_0")
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_up.weight")
    w = sd["model.layers.0.mlp.up_proj.weight"]
    np.testing.assert_array_equal(np.asarray(t.data).reshape(-1), gguf.quants.quantize(w, T.Q8_0).reshape(-1))


def test_bpe_tokenizer_metadata(models, hf_reference, tmp_path):
    hf_dir, _, _ = models["mistral-tied"]
    tok = hf_reference.tokenizer("bpe")
    kv = _fields(gguf.GGUFReader(_convert(hf_dir, tmp_path, "f16")))
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == "llama-bpe"
    vocab = tok["vocab"]
    assert all(kv["tokenizer.ggml.tokens"][i] == t for t, i in vocab.items())
    merges = json.load(open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8"))["model"]["merges"]
    assert kv["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert kv["tokenizer.ggml.bos_token_id"] == tok["bos_token_id"]
    assert kv["tokenizer.ggml.eos_token_id"] == tok["eos_token_id"]
    assert kv["tokenizer.ggml.add_bos_token"] is False
    im_start = vocab["<|im_start|>"]
    assert kv["tokenizer.ggml.token_type"][im_start] == 3   # control
    assert kv["tokenizer.ggml.token_type"][vocab["a"]] == 1
    assert kv["tokenizer.chat_template"] == tok["chat_template"]


def test_padded_vocab_rows(models, hf_reference, tmp_path):
    hf_dir, cfg, _ = models["qwen2-untied-sharded-padded"]
    n_tok = hf_reference.tokenizer("bpe")["n_tokens"]
    kv = _fields(gguf.GGUFReader(_convert(hf_dir, tmp_path, "f32")))
    assert len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"] == n_tok + 8
    assert kv["tokenizer.ggml.tokens"][n_tok] == f"[PAD{n_tok}]"
    assert set(kv["tokenizer.ggml.token_type"][n_tok:]) == {5}   # unused


# -------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("outtype,tol", [("f32", 1e-4), ("f16", 1e-2), ("q8_0", 6e-2)])
def test_logits_match_transformers(models, hf_reference, tmp_path, name, outtype, tol):
    hf_dir, _, _ = models[name]
    path = _convert(hf_dir, tmp_path, outtype)
    want = hf_reference.logits(name, PROMPT)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < tol, f"{name} {outtype}: max|diff|/max|ref| = {rel:.2e}"


def test_bf16_checkpoint_to_bf16_is_lossless(models, hf_reference, tmp_path):
    hf_dir, _, _ = models["llama-untied-sharded-bf16"]
    path = _convert(hf_dir, tmp_path, "bf16")
    want = hf_reference.logits("llama-untied-sharded-bf16", PROMPT)
    rel = np.abs(hf_tiny.ember_logits(path, PROMPT) - want).max() / np.abs(want).max()
    assert rel < 1e-4, f"bf16 -> bf16: max|diff|/max|ref| = {rel:.2e}"


# ----------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer_ggufs(tmp_path_factory):
    """kind -> GGUF path: a tiny model per tokenizer, at f16."""
    root = tmp_path_factory.mktemp("tokmodels")
    out = {}
    for kind in TOKENIZERS:
        d = str(root / kind)
        hf_tiny.build("tokenizer-llama", d, tokenizer=kind)
        out[kind] = str(root / f"{kind}.gguf")
        convert(d, out[kind], "f16", progress=False)
    return out


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_tokenizer_matches_hf(tokenizer_ggufs, hf_reference, kind):
    """SentencePiece cases compare with transformers' SentencePiece-backed tokenizer; the
    tokenizers-based LlamaTokenizer must agree too wherever the text does not start with
    whitespace (there it drops SentencePiece's dummy prefix, unlike SentencePiece and llama.cpp)."""
    et = _ember.Tokenizer.from_gguf_file(tokenizer_ggufs[kind])

    def want(text, add_special_tokens, backend="fast" if kind == "bpe" else "sentencepiece"):
        return hf_reference.encode(TOKENIZERS[kind], text, add_special_tokens, backend)

    for text in hf_tiny.TEST_TEXTS:
        got = et.encode(text.encode("utf-8"), False, False)
        assert got == want(text, False), repr(text)
        if not text[:1].isspace():
            assert got == want(text, False, "fast"), repr(text)
        # With the model's own BOS/EOS rule (add_bos is honoured only where the file asks for it).
        assert et.encode(text.encode("utf-8"), True, False) == want(text, True), repr(text)
    if kind == "bpe":
        text = hf_tiny.SPECIAL_TEXT
        assert et.encode(text.encode("utf-8"), False, True) == want(text, False)


def test_spm_metadata(tokenizer_ggufs, hf_reference):
    kv = _fields(gguf.GGUFReader(tokenizer_ggufs["spm"]))
    assert kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.bos_token_id"] == 1 and kv["tokenizer.ggml.eos_token_id"] == 2
    assert kv["tokenizer.ggml.unknown_token_id"] == 0
    types = kv["tokenizer.ggml.token_type"]
    assert types[0] == 2 and types[1] == 3 and types[2] == 3
    byte_ids = [i for i, t in enumerate(kv["tokenizer.ggml.tokens"]) if t.startswith("<0x")]
    assert len(byte_ids) == 256 and all(types[i] == 6 for i in byte_ids)
    assert kv["tokenizer.ggml.add_space_prefix"] is True
    assert len(kv["tokenizer.ggml.scores"]) == hf_reference.tokenizer("spm")["n_tokens"]


# -------------------------------------------------------------------------------------- errors


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ember.convert", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _assert_one_line_error(stderr, *needles):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ember-convert: error: "), stderr
    for n in needles:
        assert n in lines[0], stderr


def test_error_unsupported_architecture(models, tmp_path):
    d = shutil.copytree(models["mistral-tied"][0], str(tmp_path / "m"))
    cfg_path = os.path.join(d, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    json.dump(cfg, open(cfg_path, "w"))
    out = str(tmp_path / "o.gguf")
    p = _run_cli(d, "-o", out)
    assert p.returncode != 0
    _assert_one_line_error(p.stderr, "GPTNeoXForCausalLM")
    assert not os.path.exists(out)


def test_error_missing_config(models, tmp_path, capsys):
    d = shutil.copytree(models["mistral-tied"][0], str(tmp_path / "m"))
    os.remove(os.path.join(d, "config.json"))
    assert main([d, "-o", str(tmp_path / "o.gguf")]) != 0
    _assert_one_line_error(capsys.readouterr().err, "config.json")


def test_error_missing_weights(models, tmp_path, capsys):
    d = shutil.copytree(models["mistral-tied"][0], str(tmp_path / "m"))
    os.remove(os.path.join(d, "model.safetensors"))
    assert main([d, "-o", str(tmp_path / "o.gguf")]) != 0
    _assert_one_line_error(capsys.readouterr().err, "safetensors")


def test_error_missing_shard(models, tmp_path, capsys):
    d = shutil.copytree(models["llama-untied-sharded-bf16"][0], str(tmp_path / "m"))
    shard = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))[1]
    os.remove(os.path.join(d, shard))
    assert main([d, "-o", str(tmp_path / "o.gguf")]) != 0
    _assert_one_line_error(capsys.readouterr().err, shard)


def test_error_wrong_shape(models, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    d = shutil.copytree(models["mistral-tied"][0], str(tmp_path / "m"))
    st = os.path.join(d, "model.safetensors")
    tensors = load_file(st)
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:-1]
    save_file(tensors, st, metadata={"format": "pt"})
    out = str(tmp_path / "o.gguf")
    assert main([d, "-o", out]) != 0
    _assert_one_line_error(capsys.readouterr().err, "model.layers.1.mlp.up_proj.weight", "[159, 64]")
    assert not os.path.exists(out)


def test_cli_writes_file_with_progress(models, tmp_path):
    out = str(tmp_path / "o.gguf")
    p = _run_cli(models["mistral-tied"][0], "-o", out, "--outtype", "q8_0")
    assert p.returncode == 0, p.stderr
    assert "tensor" in p.stderr   # the progress bar
    assert _fields(gguf.GGUFReader(out))["general.file_type"] == 7


# ---------------------------------------------------------------------------------- references


@pytest.mark.hf_live
def test_committed_references_are_what_the_generator_writes(hf_generator, smollm2_path, tmp_path):
    """tests/reference/hf is what tools/gen_hf_references.py writes with the transformers installed
    here: the same tokenizer files, model layouts, weight hashes, token ids and chat prompts, and
    logits and hidden states within 1e-5 of their largest magnitude (torch's CPU kernels may sum
    in another order on another machine)."""
    out = tmp_path / "hf"
    out.mkdir()
    hf_generator.generate(out, smollm2_path, tmp_path / "work")

    def files(root):
        return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name != "README.md")

    assert files(out) == files(hf_tiny.REFERENCE)
    for rel in files(out):
        new, old = out / rel, hf_tiny.REFERENCE / rel
        if rel.suffix != ".npz":
            assert new.read_bytes() == old.read_bytes(), f"{rel} is stale: rerun tools/gen_hf_references.py"
            continue
        with np.load(new) as a, np.load(old) as b:
            assert sorted(a) == sorted(b)
            for k in a:
                assert a[k].shape == b[k].shape, k
                err = np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()
                assert err <= 1e-5, f"{rel}[{k}]: max|diff|/max|ref| = {err:.2e}: rerun tools/gen_hf_references.py"
