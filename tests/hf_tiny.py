"""Tiny Hugging Face checkpoints for the converter and embedding tests, and transformers' outputs on
them, without torch or transformers.

tests/reference/hf holds what only transformers can say, written once by tools/gen_hf_references.py:
each tiny model's layout as transformers saves it (config.json, tensor names and shapes, shards), the
tokenizer files as transformers writes them, and transformers' logits, hidden states, token ids and
chat prompts. The weights are not committed: build() draws them from a seeded numpy generator and
writes the safetensors files, the same bytes on every run (models.json records their sha256).

Tests get transformers' outputs from the `hf_reference` fixture: the committed ones, and, where torch
and transformers import, the same outputs computed now (marker hf_live)."""
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference" / "hf"
GENERATOR = ROOT / "tools" / "gen_hf_references.py"
LIVE_SKIP_REASON = ("hf_live: comparing with transformers itself needs torch and transformers "
                    "(pip install '.[hf]' --extra-index-url https://download.pytorch.org/whl/cpu)")

# ---- the inputs the references were computed on (the generator reads them from here)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. She said: \"it's fine, we'll see!\"",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 42; ++i) { sum += a[i] * 3.14159; }",
    "Numbers: 0 1 12 123 1234 12345 3.5e-7 -42 1,000,000 2024-06-01",
    "Punctuation!?... (brackets) [square] {curly} <angle> #hash @at $dollar %percent ^&*_+=|\\/~`",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, 日本語のテキスト, 中文, 한국어",
    "Emoji: 😀 🚀 👍🏽 ❤️ 🇫🇷",
    "Whitespace   runs\t\ttabs\n\n\nnew lines    and  trailing spaces   ",
    "I'm you're they've he'd we'll it's DON'T Can'T",
]

# Text the tokenizers were not trained on, so merges run out and byte fallback is exercised.
TEST_TEXTS = CORPUS + [
    "Zebras zigzag quixotically; 98765 xylophones vex jumpy wizards.",
    "    indented = {'key': [1, 2, 3]}\r\n\r\n",
    "Mixed: naïve🚀rocket 42x 日本 \u00a0nbsp  \u2003emspace",
    "",
    " ",
    "\n",
    "a",
    "ŝ ǅ ẞ ﬀ Å",
]
# Text with the byte-level BPE tokenizer's special tokens, parsed as specials.
SPECIAL_TEXT = "<|im_start|>user\nHi there<|im_end|>\n"

SHORT_PROMPT = [1, 7, 42, 99, 3, 250, 17, 5, 311, 64, 128, 9, 200, 33]
# 40 tokens: past Gemma's window (8) and the rope-scaled models' original context (32).
LONG_PROMPT = [1] + [(37 * i + 11) % 250 + 3 for i in range(39)]

EMBED_TEXT = "The quick brown fox jumps over the lazy dog."
EMBED_IDS = [int(t) for t in np.random.default_rng(0).integers(3, 300, size=37)]

CHAT_MESSAGES = [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Héllo, what is 2+2?"},
                 {"role": "assistant", "content": "4."},
                 {"role": "user", "content": "And 3+3?"}]

# ---- checkpoints


def models(root=REFERENCE):
    """name -> what transformers saves for that tiny model (models.json, from the generator)."""
    with open(pathlib.Path(root) / "models.json", encoding="utf-8") as f:
        return json.load(f)


def copy_tokenizer(kind, out_dir, root=REFERENCE):
    """The committed tokenizer files of kind ("bpe", "spm", "spm-nodummy") into out_dir; "spm-json"
    is "spm" without tokenizer.model, so that only the HF files describe it."""
    src = pathlib.Path(root) / "tokenizers" / ("spm" if kind == "spm-json" else kind)
    os.makedirs(out_dir, exist_ok=True)
    for f in src.iterdir():
        if not (kind == "spm-json" and f.name == "tokenizer.model"):
            shutil.copyfile(f, os.path.join(out_dir, f.name))


def _bf16(x):
    """float32 -> bfloat16 bits, rounded to nearest even as torch rounds."""
    u = x.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _draw(spec):
    """Random weights in the stored dtype, held as float32. transformers initialises norms to ones and
    biases to zeros; random values make the tests see a swapped or misplaced norm or bias."""
    rng = np.random.default_rng(spec["seed"])
    out = {}
    for name in sorted(spec["tensors"]):
        x = rng.standard_normal(spec["tensors"][name])
        if name.endswith("norm.weight"):
            x = 1.0 + 0.2 * x
        elif name.endswith((".bias", "gate_up_proj_bias", "down_proj_bias")):
            x = 0.1 * x
        elif name.endswith(".sinks"):
            x = 1.0 * x   # logits beside the attention scores: of their size, so they matter
        elif name.endswith("gate_up_proj"):
            x = 0.5 * x   # large enough that gpt-oss's clamps at +-7 act
        elif name.endswith("layer_scalar"):
            # Gemma 4's factor on the whole hidden state: near 1, since near 0 each layer's output
            # would swamp the stream and leave the model too ill-conditioned to compare at f32.
            x = 1.0 + 0.2 * x
        else:
            x = 0.08 * x
        x = x.astype(np.float32)
        if spec["dtype"] == "bfloat16":
            x = (_bf16(x).astype(np.uint32) << 16).view(np.float32)
        out[name] = x
    return out


# Where a multimodal checkpoint keeps its language model's tensors.
_LANGUAGE_MODEL_PREFIXES = ("language_model.model.", "model.language_model.")


def _weights(spec, root):
    """A multimodal model holds its text model's weights (under its prefix) and random others."""
    weights = _draw(spec)
    if spec.get("text_model"):
        text = _draw(models(root)[spec["text_model"]])
        for name in weights:
            for prefix in _LANGUAGE_MODEL_PREFIXES:
                if name.startswith(prefix):
                    weights[name] = text["model." + name[len(prefix):]]
    return weights


def _write_safetensors(path, tensors, dtype):
    """The safetensors layout (header length, JSON header, raw little-endian data), written here
    because safetensors' numpy API has no bfloat16."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    bf16 = dtype == "bfloat16"
    for name in sorted(tensors):
        x = tensors[name]
        data = (_bf16(x).astype("<u2") if bf16 else x.astype("<f4")).tobytes()
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(x.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def weights_sha256(model_dir):
    digest = hashlib.sha256()
    for name in sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors")):
        with open(os.path.join(model_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def build(name, out_dir, tokenizer=None, root=REFERENCE):
    """Writes the tiny model `name` (config.json, safetensors, its tokenizer or the one of kind
    `tokenizer`) into out_dir. Returns its weights as float32 arrays holding exactly the stored values."""
    spec = models(root)[name]
    copy_tokenizer(tokenizer or spec["tokenizer"], out_dir, root)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(spec["config"], f, indent=2, sort_keys=True)
    weights = _weights(spec, root)
    if spec["index"] is None:
        _write_safetensors(os.path.join(out_dir, "model.safetensors"), weights, spec["dtype"])
    else:
        for shard in sorted(set(spec["index"]["weight_map"].values())):
            part = {n: w for n, w in weights.items() if spec["index"]["weight_map"][n] == shard}
            _write_safetensors(os.path.join(out_dir, shard), part, spec["dtype"])
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump(spec["index"], f, indent=2, sort_keys=True)
    if "sha256" in spec and weights_sha256(out_dir) != spec["sha256"]:
        raise AssertionError(f"the weights of tiny model {name} differ from those {root} was computed on "
                             "(has numpy's random generator changed?): rerun tools/gen_hf_references.py")
    return weights


# ---- transformers' outputs


class CommittedReference:
    """transformers' outputs as tests/reference/hf holds them, looked up by their inputs."""

    def __init__(self, root=REFERENCE):
        with open(pathlib.Path(root) / "outputs.json", encoding="utf-8") as f:
            self._tables = json.load(f)
        with np.load(pathlib.Path(root) / "outputs.npz") as z:
            self._arrays = dict(z)

    def _find(self, table, **inputs):
        for entry in self._tables[table]:
            if all(entry[k] == v for k, v in inputs.items()):
                return entry
        raise LookupError(f"tests/reference/hf has no {table} for {inputs!r}: tools/gen_hf_references.py "
                          "computes the cases the tests ask for (add this one there and rerun it)")

    def logits(self, model, ids):
        """[len(ids), n_vocab] for one sequence."""
        return self._arrays[self._find("logits", model=model, ids=list(ids))["array"]]

    def hidden(self, model, ids):
        """Hidden states after the final norm, [len(ids), n_embd]."""
        return self._arrays[self._find("hidden", model=model, ids=list(ids))["array"]]

    def inv_freq(self, model):
        """The rotary embedding's inverse frequencies (float32)."""
        return self._arrays[self._find("inv_freq", model=model)["array"]]

    def encode(self, tokenizer, text, add_special_tokens=True, backend="fast"):
        """Token ids from transformers' fast tokenizer, or ("sentencepiece") from its
        SentencePiece-backed one."""
        return self._find("encode", tokenizer=tokenizer, backend=backend, text=text,
                          add_special_tokens=add_special_tokens)["ids"]

    def tokenizer(self, tokenizer):
        """len(tok), bos/eos ids, chat template and vocab of transformers' fast tokenizer."""
        return self._find("tokenizer", tokenizer=tokenizer)["info"]

    def render(self, source, messages, **kwargs):
        """apply_chat_template(messages, chat_template=source, tokenize=False, **kwargs)."""
        sha = hashlib.sha256(source.encode()).hexdigest()
        return self._find("render", template_sha256=sha, messages=messages, kwargs=kwargs)["text"]


def live_generator():
    """tools/gen_hf_references.py as a module (tools/ is not a package), or a skip, with its
    reason, where torch or transformers does not import."""
    pytest.importorskip("torch", reason=LIVE_SKIP_REASON)
    pytest.importorskip("transformers", reason=LIVE_SKIP_REASON)
    spec = importlib.util.spec_from_file_location("gen_hf_references", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hf_generator():
    """tools/gen_hf_references.py, where torch and transformers import (else the test is skipped)."""
    return live_generator()


@pytest.fixture(scope="module", params=["committed", pytest.param("live", marks=pytest.mark.hf_live)])
def hf_reference(request, tmp_path_factory):
    """transformers' outputs: committed, or computed now on the same files (hf_live)."""
    if request.param == "committed":
        return CommittedReference()
    return live_generator().LiveReference(REFERENCE, tmp_path_factory.mktemp("hf_live"))


def rel_diff(got, want):
    """max|got - want| / max|want|: the issue's measure of agreement with transformers."""
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def cpu_context(path, n_batch=64):
    """A CPU Context with an f32 KV cache, for comparisons with transformers' f32 attention."""
    from ember import _ember
    m = _ember.Model(str(path), n_gpu_layers=0)
    return _ember.Context(m, n_ctx=64, n_batch=n_batch, n_threads=2, type_k="f32", type_v="f32")


def eval_rows(ctx, ids):
    """The logits of every id, evaluated in one call, as rows [len(ids), n_vocab]."""
    ctx.eval(ids, logits_all=True)
    return np.stack([np.asarray(ctx.logits(i)) for i in range(len(ids))])


def engine_greedy(engine, prompt, **kw):
    """(generated tokens, prompt logprobs) of one greedy request run alone in an _ember.Engine."""
    rid = engine.add_request(prompt, temperature=0.0, **kw)
    tokens, lps, done = [], [], False
    while not done:
        for o in engine.poll(1.0):
            assert o.request_id == rid
            tokens += o.token_ids
            lps += o.prompt_logprobs
            done = o.finished
    return tokens, lps


def check_engine_preemption(path):
    """A pool too small for every sequence: the newest are preempted and recomputed on a fresh state
    slot, each sequence's greedy tokens are those it has alone, and afterwards every slot and block is
    free."""
    from ember import _ember
    m = _ember.Model(str(path), n_gpu_layers=0)
    kw = dict(n_ctx=64, max_num_batched_tokens=32, n_threads=2, type_k="f32", type_v="f32", kv_block_size=16)
    engine = _ember.Engine(m, max_num_seqs=4, kv_blocks=4, **kw)
    rng = np.random.default_rng()
    prompts = [[1] + [int(t) for t in rng.integers(3, 390, size=int(n))] for n in rng.integers(8, 20, size=5)]
    # EOS ignored: a sequence the random model ends early would leave the pool room enough not to preempt
    ids = [engine.add_request(p, temperature=0.0, max_tokens=30, ignore_eos=True) for p in prompts]
    tokens, left = {i: [] for i in ids}, set(ids)
    while left:
        for o in engine.poll(1.0):
            tokens[o.request_id] += o.token_ids
            if o.finished:
                left.discard(o.request_id)
    stats = engine.stats()
    engine.close()
    assert stats["preemptions"] > 0
    assert stats["state_slots_total"] == stats["state_slots_free"] == 4 and stats["kv_blocks_used"] == 0
    alone = _ember.Engine(m, max_num_seqs=1, **kw)
    for i, p in zip(ids, prompts):
        assert tokens[i] == engine_greedy(alone, p, max_tokens=30, ignore_eos=True)[0]
    alone.close()


def ember_logits(path, ids, n_gpu_layers=0, kv_type="f32", chunk=64, n_ctx=64):
    """ember's logits [len(ids), n_vocab], the ids evaluated `chunk` at a time. By default on the
    CPU with an f32 KV cache: the comparison is with transformers' f32 attention, not llama.cpp's
    f16 cache."""
    from ember import _ember
    m = _ember.Model(str(path), n_gpu_layers=n_gpu_layers)
    ctx = _ember.Context(m, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, type_k=kv_type, type_v=kv_type)
    rows = []
    for start in range(0, len(ids), chunk):
        piece = ids[start:start + chunk]
        ctx.eval(piece, logits_all=True)
        rows += [np.asarray(ctx.logits(i)) for i in range(len(piece))]
    return np.stack(rows)


# ------------------------------------------------- what the architecture tests share (test_arch_*.py)


def converted(tmp_path_factory, names, dirname):
    """name -> (HF dir, float32 weights exactly as stored, path of its f32 GGUF by ember-convert)."""
    from ember.convert import convert
    root = tmp_path_factory.mktemp(dirname)
    out = {}
    for name in names:
        d = str(root / name)
        weights = build(name, d)
        path = str(root / f"{name}.gguf")
        convert(d, path, "f32", progress=False)
        out[name] = (d, weights, path)
    return out


def gguf_fields(path):
    import gguf
    return {name: f.contents() for name, f in gguf.GGUFReader(path).fields.items()}


def gguf_tensors(path):
    """GGUF name -> array in numpy (HF) order."""
    import gguf
    return {t.name: np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)])
            for t in gguf.GGUFReader(path).tensors}


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def check_inside_an_engine_batch(path, hf_reference, name, device, prompt=LONG_PROMPT):
    """`prompt` among other sequences of the engine's steps (chunked prefill beside other sequences'
    decodes), on the CPU or with every block on the GPU, both with an f32 KV cache: its prompt
    logprobs are transformers'."""
    from ember import _ember
    if device == "cuda" and "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    m = _ember.Model(path, n_gpu_layers=-1 if device == "cuda" else 0)
    engine = _ember.Engine(m, n_ctx=128, max_num_seqs=8, max_num_batched_tokens=24, n_threads=2, type_k="f32",
                           type_v="f32")
    rng = np.random.default_rng()
    others = [[1] + [int(t) for t in rng.integers(3, 390, size=int(n))] for n in rng.integers(5, 30, size=5)]
    ids = [engine.add_request(p, temperature=0.0, max_tokens=12) for p in others[:3]]
    ref = engine.add_request(prompt, temperature=0.0, max_tokens=4, prompt_logprobs=True)
    ids += [engine.add_request(p, temperature=0.0, max_tokens=12) for p in others[3:]]
    got, left = [], set(ids) | {ref}
    while left:
        for o in engine.poll(1.0):
            if o.request_id == ref:
                got += o.prompt_logprobs
            if o.finished:
                assert o.finish_reason in ("stop", "length"), o.error
                left.discard(o.request_id)
    engine.close()
    want_logits = hf_reference.logits(name, prompt)
    want = log_softmax(want_logits)[np.arange(len(prompt) - 1), prompt[1:]]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * 2 * np.abs(want_logits).max())


def edited(src, dst, edit):
    """A copy of checkpoint folder src at dst whose config.json `edit` changed: a callable taking the
    config dict, or a dict of fields to set."""
    d = shutil.copytree(src, dst)
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    if callable(edit):
        edit(cfg)
    else:
        cfg.update(edit)
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return d


def greedy_bytes(path, prompt, n_predict):
    """ember's greedy continuation of prompt (special tokens parsed, a BOS first) as llama.cpp's
    llama-simple prints it: each piece with printf("%s"), so a piece ends at its first NUL byte."""
    from ember.llama import Llama
    with Llama(path, n_ctx=128, verbose=False) as llm:
        llm.eval(llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))
        out = []
        for _ in range(n_predict):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if tok == llm.token_eos():
                break
            out.append(tok)
            llm.eval([tok])
        return b"".join(llm.detokenize([t], special=True).split(b"\0")[0] for t in out)


def rewritten_gguf(src, dst, drop=(), fields=None, extra=()):
    """A copy of a GGUF without the tensors `drop`, with metadata replaced (fields; new keys as uint32; a
    None value drops the key) and the tensors `extra` ((name, float32 array)) appended."""
    import gguf
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    fields = dict(fields or {})
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or fields.get(f.name, 0) is None:
            continue
        writer.add_key_value(f.name, fields.pop(f.name, f.contents()), f.types[0],
                             f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for k, v in fields.items():
        if v is not None:
            writer.add_uint32(k, v)
    for t in reader.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, data in extra:
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# The placements a CPU-only architecture refuses: some blocks, all of them, a block moved there by an override.
GPU_PLACEMENTS = [dict(n_gpu_layers=1), dict(n_gpu_layers=-1), dict(n_gpu_layers=0, override_tensor=[r"blk\.1\.=CUDA"])]


def check_gpu_placement_taken(path, fields):
    """A GPU placement of `path` (an architecture that runs on every backend) is planned as asked: the blocks
    the fields name on CUDA, the others on the CPU. placement_plan plans as if CUDA were built in, so a CPU-only
    build checks that nothing refuses it."""
    from ember import _ember
    plan = _ember.placement_plan(path, have_gpu=True, **fields)
    n = len(plan["blocks"])
    if "override_tensor" in fields:
        want = ["CUDA" if i == 1 else "CPU" for i in range(n)]
    else:
        k = fields["n_gpu_layers"] if fields["n_gpu_layers"] >= 0 else n
        want = ["CPU"] * (n - k) + ["CUDA"] * k
    assert list(plan["blocks"]) == want, plan["blocks"]


def check_cuda_logits_match_cpu(path, prompt, chunk, bound=2e-3):
    """Every block on the GPU against the CPU, both with the f16 KV cache, `chunk` tokens a step."""
    from ember import _ember
    if "cuda" not in _ember.backends():
        pytest.skip("this ember was built without the CUDA backend")
    want = ember_logits(path, prompt, kv_type="f16")
    got = ember_logits(path, prompt, n_gpu_layers=-1, kv_type="f16", chunk=chunk)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= bound, f"{path}: max|diff|/max|ref| = {rel:.2e}"


def check_gpu_placement_refused(path, fields):
    """A GPU placement of `path` (an architecture that runs on the CPU only) is refused when the file is placed,
    naming the architecture, why, and n_gpu_layers=0; every block on the CPU (n_gpu_layers=0, or an override
    that keeps them there whatever n_gpu_layers says) is accepted. placement_plan plans as if CUDA were built in,
    so a CPU-only build exercises the check Model.load makes with its plan."""
    from ember import _ember
    arch = gguf_fields(path)["general.architecture"]
    with pytest.raises(Exception, match=rf"{arch} cannot have blocks on the GPU: .*host memory.*n_gpu_layers=0") as e:
        _ember.placement_plan(path, have_gpu=True, **fields)
    assert str(e.value).startswith(str(path)), str(e.value)
    assert ("no tensor overrides to CUDA" in str(e.value)) == ("override_tensor" in fields), str(e.value)
    for ok in (dict(n_gpu_layers=0), dict(n_gpu_layers=-1, override_tensor=[r"^blk\.=CPU"])):
        plan = _ember.placement_plan(path, have_gpu=True, **ok)
        assert set(plan["blocks"]) == set(plan["experts"]) == {"CPU"} and plan["head"] == "CPU"
