"""ember-convert (HF -> GGUF): tiny random Llama/Mistral/Qwen2 models and locally trained tokenizers
are converted; ember's logits and tokens must match transformers', the GGUF metadata and tensor
layout must be what llama.cpp's format expects, and bad input gives a one-line error."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to read converted files")
pytest.importorskip("torch", reason="torch is needed to run the transformers reference")
pytest.importorskip("transformers", reason="transformers builds the reference models")
pytest.importorskip("sentencepiece", reason="sentencepiece trains the SentencePiece tokenizer")

sys.path.insert(0, os.path.dirname(__file__))
import hf_tiny  # noqa: E402

from ember import _ember  # noqa: E402
from ember.convert import convert, main  # noqa: E402

T = gguf.GGMLQuantizationType
PROMPT = [1, 7, 42, 99, 3, 250, 17, 5, 311, 64, 128, 9, 200, 33]

# name -> (arch, tied, sharded, stored dtype, extra vocab rows past the tokenizer)
MODELS = {
    "llama-untied-sharded-bf16": ("llama", False, True, "bfloat16", 0),
    "mistral-tied": ("mistral", True, False, "float32", 0),
    "qwen2-untied-sharded-padded": ("qwen2", False, True, "float32", 8),
}


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory):
    """Tokenizers trained once per module: byte-level BPE and SentencePiece (model and json-only)."""
    root = tmp_path_factory.mktemp("tok")
    bpe = hf_tiny.bpe_tokenizer(str(root / "bpe"))
    return {
        "bpe": (str(root / "bpe"), bpe, bpe),
        "spm": (str(root / "spm"), *hf_tiny.spm_tokenizer(str(root / "spm"))),
        "spm-json": (str(root / "spmj"), *hf_tiny.spm_tokenizer(str(root / "spmj"), keep_model=False)),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizers_dir):
    """name -> (HF dir, float32 reference model with exactly the stored weights)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    tok_dir, tok, _ = tokenizers_dir["bpe"]
    for seed, (name, (arch, tied, shard, dtype, extra)) in enumerate(MODELS.items()):
        d = str(root / name)
        shutil.copytree(tok_dir, d, dirs_exist_ok=True)
        ref = hf_tiny.tiny_model(d, arch, len(tok) + extra, tied=tied, shard=shard, dtype=dtype, seed=seed)
        out[name] = (d, ref)
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
    hf_dir, ref = models[name]
    arch_name, tied, _, _, _ = MODELS[name]
    cfg = ref.config
    arch = "qwen2" if arch_name == "qwen2" else "llama"
    path = _convert(hf_dir, tmp_path, outtype)
    r = gguf.GGUFReader(path)
    kv = _fields(r)
    assert kv["general.architecture"] == arch
    assert kv["general.name"] == name
    assert kv["general.file_type"] == {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[outtype]
    assert kv["general.quantization_version"] == gguf.GGML_QUANT_VERSION
    assert kv[f"{arch}.context_length"] == cfg.max_position_embeddings
    assert kv[f"{arch}.embedding_length"] == 64
    assert kv[f"{arch}.block_count"] == 2
    assert kv[f"{arch}.feed_forward_length"] == 160
    assert kv[f"{arch}.attention.head_count"] == 4
    assert kv[f"{arch}.attention.head_count_kv"] == 2
    assert kv[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert kv[f"{arch}.rope.freq_base"] == pytest.approx(cfg.rope_parameters["rope_theta"])
    assert kv[f"{arch}.rope.dimension_count"] == 16
    assert kv[f"{arch}.vocab_size"] == cfg.vocab_size
    assert len(kv["tokenizer.ggml.tokens"]) == cfg.vocab_size

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
    assert [int(x) for x in tensors["token_embd.weight"].shape] == [64, cfg.vocab_size]


@pytest.mark.parametrize("name", list(MODELS))
def test_qk_layout(models, tmp_path, name):
    """GGUF's llama layout pairs rotary dims as adjacent rows (2i, 2i+1) of each head, where HF pairs
    row i with row i + head_dim/2; qwen2 (NEOX rope) keeps HF's order. All other tensors are copied."""
    hf_dir, ref = models[name]
    path = _convert(hf_dir, tmp_path, "f32")
    tensors = {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in
               gguf.GGUFReader(path).tensors}
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
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
    hf_dir, ref = models["mistral-tied"]
    path = _convert(hf_dir, tmp_path, "q8_0")
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_up.weight")
    w = ref.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy()
    np.testing.assert_array_equal(np.asarray(t.data).reshape(-1), gguf.quants.quantize(w, T.Q8_0).reshape(-1))


def test_bpe_tokenizer_metadata(models, tokenizers_dir, tmp_path):
    hf_dir, _ = models["mistral-tied"]
    tok = tokenizers_dir["bpe"][1]
    kv = _fields(gguf.GGUFReader(_convert(hf_dir, tmp_path, "f16")))
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == "llama-bpe"
    vocab = tok.get_vocab()
    assert all(kv["tokenizer.ggml.tokens"][i] == t for t, i in vocab.items())
    merges = json.load(open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8"))["model"]["merges"]
    assert kv["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert kv["tokenizer.ggml.bos_token_id"] == tok.bos_token_id
    assert kv["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    assert kv["tokenizer.ggml.add_bos_token"] is False
    im_start = vocab["<|im_start|>"]
    assert kv["tokenizer.ggml.token_type"][im_start] == 3   # control
    assert kv["tokenizer.ggml.token_type"][vocab["a"]] == 1
    assert kv["tokenizer.chat_template"] == tok.chat_template


def test_padded_vocab_rows(models, tokenizers_dir, tmp_path):
    hf_dir, ref = models["qwen2-untied-sharded-padded"]
    n_tok = len(tokenizers_dir["bpe"][1])
    kv = _fields(gguf.GGUFReader(_convert(hf_dir, tmp_path, "f32")))
    assert len(kv["tokenizer.ggml.tokens"]) == ref.config.vocab_size == n_tok + 8
    assert kv["tokenizer.ggml.tokens"][n_tok] == f"[PAD{n_tok}]"
    assert set(kv["tokenizer.ggml.token_type"][n_tok:]) == {5}   # unused


# -------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("outtype,tol", [("f32", 1e-4), ("f16", 1e-2), ("q8_0", 6e-2)])
def test_logits_match_transformers(models, tmp_path, name, outtype, tol):
    hf_dir, ref = models[name]
    path = _convert(hf_dir, tmp_path, outtype)
    want = hf_tiny.hf_logits(ref, PROMPT)
    got = hf_tiny.ember_logits(path, PROMPT)
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel < tol, f"{name} {outtype}: max|diff|/max|ref| = {rel:.2e}"


def test_bf16_checkpoint_to_bf16_is_lossless(models, tmp_path):
    hf_dir, ref = models["llama-untied-sharded-bf16"]
    path = _convert(hf_dir, tmp_path, "bf16")
    want = hf_tiny.hf_logits(ref, PROMPT)
    rel = np.abs(hf_tiny.ember_logits(path, PROMPT) - want).max() / np.abs(want).max()
    assert rel < 1e-4, f"bf16 -> bf16: max|diff|/max|ref| = {rel:.2e}"


# ----------------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tokenizer_ggufs(tmp_path_factory, tokenizers_dir):
    """kind -> (GGUF path, HF tokenizer, reference tokenizer): a tiny model per tokenizer, at f16."""
    root = tmp_path_factory.mktemp("tokmodels")
    out = {}
    for kind, (tok_dir, tok, reference) in tokenizers_dir.items():
        d = str(root / kind)
        shutil.copytree(tok_dir, d, dirs_exist_ok=True)
        hf_tiny.tiny_model(d, "llama", len(tok))
        path = str(root / f"{kind}.gguf")
        convert(d, path, "f16", progress=False)
        out[kind] = (path, tok, reference)
    return out


@pytest.mark.parametrize("kind", ["bpe", "spm", "spm-json"])
def test_tokenizer_matches_hf(tokenizer_ggufs, kind):
    """SentencePiece cases compare with transformers' SentencePiece-backed tokenizer; the
    tokenizers-based LlamaTokenizer must agree too wherever the text does not start with
    whitespace (there it drops SentencePiece's dummy prefix; see hf_tiny.spm_tokenizer)."""
    path, tok, reference = tokenizer_ggufs[kind]
    et = _ember.Tokenizer.from_gguf_file(path)
    for text in hf_tiny.TEST_TEXTS:
        got = et.encode(text.encode("utf-8"), False, False)
        assert got == reference.encode(text, add_special_tokens=False), repr(text)
        if not text[:1].isspace():
            assert got == tok.encode(text, add_special_tokens=False), repr(text)
        # With the model's own BOS/EOS rule (add_bos is honoured only where the file asks for it).
        assert et.encode(text.encode("utf-8"), True, False) == reference.encode(text), repr(text)
    if kind == "bpe":
        text = "<|im_start|>user\nHi there<|im_end|>\n"
        assert et.encode(text.encode("utf-8"), False, True) == tok.encode(text, add_special_tokens=False)


def test_spm_metadata(tokenizer_ggufs):
    path, tok, _ = tokenizer_ggufs["spm"]
    kv = _fields(gguf.GGUFReader(path))
    assert kv["tokenizer.ggml.model"] == "llama"
    assert kv["tokenizer.ggml.bos_token_id"] == 1 and kv["tokenizer.ggml.eos_token_id"] == 2
    assert kv["tokenizer.ggml.unknown_token_id"] == 0
    types = kv["tokenizer.ggml.token_type"]
    assert types[0] == 2 and types[1] == 3 and types[2] == 3
    byte_ids = [i for i, t in enumerate(kv["tokenizer.ggml.tokens"]) if t.startswith("<0x")]
    assert len(byte_ids) == 256 and all(types[i] == 6 for i in byte_ids)
    assert kv["tokenizer.ggml.add_space_prefix"] is True
    assert len(kv["tokenizer.ggml.scores"]) == len(tok)


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
