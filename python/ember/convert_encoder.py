"""ember-convert's encoders, as llama.cpp's converter writes them: BERT-family checkpoints (BertModel,
RoBERTa / XLM-RoBERTa, their *ForSequenceClassification rerankers) -> "bert", NomicBertModel ->
"nomic-bert" (or "nomic-bert-moe" for v2 MoE), EmbeddingGemma (Gemma3TextModel with bidirectional
attention) -> "gemma-embedding" with sentence-transformers' Dense modules as dense_2 / dense_3. The
pooling type comes from the sentence-transformers Pooling module (rank for sequence classifiers)."""
import json
import os
import re

import numpy as np

from .convert_arch import ARCHS, TensorPlan, _int, plan_tensors, read_hparams, add_hparams
from .convert_error import ConvertError
from .convert_safetensors import Checkpoint

_BERT = ("BertModel", "BertForSequenceClassification", "RobertaModel", "RobertaForSequenceClassification",
         "XLMRobertaModel", "XLMRobertaForSequenceClassification")
ENCODERS = _BERT + ("NomicBertModel", "Gemma3TextModel")
# llama.cpp's enum llama_pooling_type.
MEAN, CLS, LAST, RANK = 1, 2, 3, 4
_POOLING_MODES = {"mean": MEAN, "cls": CLS, "lasttoken": LAST}


def is_encoder(config):
    return (config.get("architectures") or [None])[0] in ENCODERS


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ConvertError(f"{path}: malformed JSON ({e})") from None


def _st_modules(model_dir):
    """sentence-transformers' modules.json entries (empty when the folder has none)."""
    path = os.path.join(model_dir, "modules.json")
    return _read_json(path) if os.path.exists(path) else []


def _pooling(model_dir, name):
    if name.endswith("ForSequenceClassification"):
        return RANK
    for mod in _st_modules(model_dir):
        if mod.get("type", "").endswith("Pooling"):
            path = os.path.join(model_dir, mod["path"], "config.json")
            cfg = _read_json(path)
            for key, value in (("pooling_mode_mean_tokens", MEAN), ("pooling_mode_cls_token", CLS),
                               ("pooling_mode_lasttoken", LAST)):
                if cfg.get(key):
                    return value
            if cfg.get("pooling_mode") in _POOLING_MODES:
                return _POOLING_MODES[cfg["pooling_mode"]]
            raise ConvertError(f"{path}: pooling other than mean, cls or lasttoken is not supported")
    return None


def _labels(config):
    """A sequence classifier's label names, unless they are the placeholders AutoConfig adds."""
    labels = config.get("id2label")
    if not labels or (len(labels) == 2 and labels.get("0") == "LABEL_0"):
        return None
    return [labels[k] for k in sorted(labels, key=int)]


class _Renamed:
    """A checkpoint seen through a name map (canonical name -> stored name)."""

    def __init__(self, checkpoint, names):
        self.checkpoint, self.map = checkpoint, names

    def names(self):
        return list(self.map)

    def shape(self, name):
        return self.checkpoint.shape(self.map[name])

    def load_f32(self, name):
        return self.checkpoint.load_f32(self.map[name])


def _expect(checkpoint, name, shape):
    if name not in checkpoint.names():
        raise ConvertError(f"missing tensor {name}")
    got = tuple(checkpoint.shape(name))
    if got != tuple(shape):
        raise ConvertError(f"tensor {name} has shape {list(got)}, expected {list(shape)}")


class _Plans:
    """Tensor plans checked against the checkpoint as they are added; every tensor must be used."""

    def __init__(self, checkpoint):
        self.checkpoint, self.plans, self.used = checkpoint, [], set()

    def add(self, hf_name, gguf_name, shape):
        _expect(self.checkpoint, hf_name, shape)
        self.used.add(hf_name)
        self.plans.append(TensorPlan(hf_name, gguf_name, tuple(shape)))

    def add_data(self, gguf_name, data, *used):
        self.used.update(used)
        self.plans.append(TensorPlan(None, gguf_name, data.shape, data=np.ascontiguousarray(data, np.float32)))

    def check_all_used(self, arch, ignored=()):
        left = [n for n in self.checkpoint.names() if n not in self.used and not any(re.search(p, n) for p in ignored)]
        if left:
            raise ConvertError(f"unexpected tensor {sorted(left)[0]} (not part of {arch})")


def _bert(name, config, path, checkpoint, writer_keys):
    E, L = _int(config, "hidden_size", path), _int(config, "num_hidden_layers", path)
    F, H = _int(config, "intermediate_size", path), _int(config, "num_attention_heads", path)
    if E % H:
        raise ConvertError(f"{path}: num_attention_heads={H} does not divide hidden_size={E}")
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConvertError(f"{path}: unsupported hidden_act '{act}' for bert (expected gelu, BERT's exact GELU)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConvertError(f"{path}: position_embedding_type '{config['position_embedding_type']}' is not supported")
    names = checkpoint.names()
    prefix = next((p for p in ("bert.", "roberta.", "") if f"{p}embeddings.word_embeddings.weight" in names), None)
    if prefix is None:
        raise ConvertError("missing tensor embeddings.word_embeddings.weight")
    roberta = "Roberta" in name
    # RoBERTa's positions start after the padding id; llama.cpp drops the rows before them.
    offset = (int(config.get("pad_token_id", 1)) + 1) if roberta else 0
    n_pos = _int(config, "max_position_embeddings", path)
    if n_pos <= offset:
        raise ConvertError(f"{path}: max_position_embeddings={n_pos} leaves no positions after the padding offset")
    V, T = _int(config, "vocab_size", path), _int(config, "type_vocab_size", path, 1)
    p = _Plans(checkpoint)
    e = prefix + "embeddings."
    p.add(e + "word_embeddings.weight", "token_embd.weight", (V, E))
    p.add(e + "token_type_embeddings.weight", "token_types.weight", (T, E))
    _expect(checkpoint, e + "position_embeddings.weight", (n_pos, E))
    p.add_data("position_embd.weight", checkpoint.load_f32(e + "position_embeddings.weight")[offset:],
               e + "position_embeddings.weight")
    p.add(e + "LayerNorm.weight", "token_embd_norm.weight", (E,))
    p.add(e + "LayerNorm.bias", "token_embd_norm.bias", (E,))
    for i in range(L):
        b, g = f"{prefix}encoder.layer.{i}.", f"blk.{i}."
        # (HF module, GGUF name, weight shape): each with a bias of the weight's first dimension.
        for hf, gg, shape in (("attention.self.query", "attn_q", (E, E)), ("attention.self.key", "attn_k", (E, E)),
                              ("attention.self.value", "attn_v", (E, E)),
                              ("attention.output.dense", "attn_output", (E, E)),
                              ("attention.output.LayerNorm", "attn_output_norm", (E,)),
                              ("intermediate.dense", "ffn_up", (F, E)), ("output.dense", "ffn_down", (E, F)),
                              ("output.LayerNorm", "layer_output_norm", (E,))):
            p.add(b + hf + ".weight", g + gg + ".weight", shape)
            p.add(b + hf + ".bias", g + gg + ".bias", shape[:1])
    pooling = _pooling(os.path.dirname(path), name)
    if name.endswith("ForSequenceClassification"):
        n_out = _int(config, "num_labels", path, len(config.get("id2label") or {0: 0}))
        if roberta:   # classifier.dense (tanh) -> classifier.out_proj
            p.add("classifier.dense.weight", "cls.weight", (E, E))
            p.add("classifier.dense.bias", "cls.bias", (E,))
            p.add("classifier.out_proj.weight", "cls.output.weight", (n_out, E))
            p.add("classifier.out_proj.bias", "cls.output.bias", (n_out,))
        else:   # BERT's pooler (dense + tanh on the CLS row) -> classifier
            p.add(prefix + "pooler.dense.weight", "cls.weight", (E, E))
            p.add(prefix + "pooler.dense.bias", "cls.bias", (E,))
            p.add("classifier.weight", "cls.output.weight", (n_out, E))
            p.add("classifier.bias", "cls.output.bias", (n_out,))
    p.check_all_used("bert", ignored=(r"(^|\.)pooler\.dense\.", r"^cls\.(predictions|seq_relationship)\.",
                                      r"(^|\.)position_ids$"))
    writer_keys += [("add_context_length", n_pos - offset), ("add_embedding_length", E), ("add_block_count", L),
                    ("add_feed_forward_length", F), ("add_head_count", H),
                    ("add_layer_norm_eps", float(config.get("layer_norm_eps", 1e-12))),
                    ("add_causal_attention", False), ("add_token_type_count", T), ("add_vocab_size", V)]
    if pooling is not None:
        writer_keys.append(("add_pooling_type", pooling))
    if name.endswith("ForSequenceClassification") and _labels(config):
        writer_keys.append(("add_classifier_output_labels", _labels(config)))
    return "bert", p.plans


def _nomic(config, path, checkpoint, writer_keys):
    """transformers' NomicBertModel names, or nomic's own (remote code) checkpoint names."""
    native = "embeddings.LayerNorm.weight" in checkpoint.names()
    get = (lambda *keys: next((config[k] for k in keys if config.get(k) is not None), None))
    E = get("hidden_size", "n_embd")
    L, H = get("num_hidden_layers", "n_layer"), get("num_attention_heads", "n_head")
    F = get("intermediate_size", "n_inner")
    if not all(isinstance(v, int) and v > 0 for v in (E, L, H, F)):
        raise ConvertError(f"{path}: hidden size, layers, heads and intermediate size must be positive integers")
    act = get("hidden_act", "activation_function")
    if get("moe_every_n_layers"):
        return _nomic_moe(config, path, checkpoint, writer_keys, get, (E, L, H, F))
    if act not in ("silu", "swiglu"):
        raise ConvertError(f"{path}: unsupported activation '{act}' for nomic-bert (expected SwiGLU)")
    for flag in ("qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias", "prenorm", "rotary_emb_interleaved"):
        if config.get(flag):
            raise ConvertError(f"{path}: nomic-bert with {flag}=true is not supported")
    if config.get("rotary_emb_fraction", 1.0) != 1.0:
        raise ConvertError(f"{path}: nomic-bert with rotary_emb_fraction != 1 is not supported")
    rope = config.get("rope_parameters") or {}
    base = float(rope.get("rope_theta", get("rope_theta", "rotary_emb_base") or 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ConvertError(f"{path}: nomic-bert rope scaling '{rope['rope_type']}' is not supported")
    V, T = get("vocab_size"), get("type_vocab_size") or 1
    n_ctx = get("max_position_embeddings", "n_positions") or 2048
    p = _Plans(checkpoint)
    if native:
        emb, ln = "embeddings.word_embeddings.weight", "embeddings.LayerNorm"
    else:
        emb, ln = "embeddings.word_embeddings.weight", "emb_ln"
    p.add(emb, "token_embd.weight", (V, E))
    p.add("embeddings.token_type_embeddings.weight", "token_types.weight", (T, E))
    p.add(ln + ".weight", "token_embd_norm.weight", (E,))
    p.add(ln + ".bias", "token_embd_norm.bias", (E,))
    for i in range(L):
        g = f"blk.{i}."
        if native:
            b = f"layers.{i}."
            for hf, gg in (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                           ("self_attn.v_proj", "attn_v")):
                p.add(b + hf + ".weight", g + gg + ".weight", (E, E))
            names = (("self_attn.o_proj", "attn_output"), ("mlp.up_proj", "ffn_up"), ("mlp.gate_proj", "ffn_gate"),
                     ("mlp.down_proj", "ffn_down"), ("post_attention_layernorm", "attn_output_norm"),
                     ("post_mlp_layernorm", "layer_output_norm"))
        else:
            b = f"encoder.layers.{i}."
            p.add(b + "attn.Wqkv.weight", g + "attn_qkv.weight", (3 * E, E))   # fused, as llama.cpp writes it
            names = (("attn.out_proj", "attn_output"), ("mlp.fc11", "ffn_up"), ("mlp.fc12", "ffn_gate"),
                     ("mlp.fc2", "ffn_down"), ("norm1", "attn_output_norm"), ("norm2", "layer_output_norm"))
        for hf, gg in names:
            shape = {"ffn_up": (F, E), "ffn_gate": (F, E), "ffn_down": (E, F)}.get(gg, (E, E))
            if gg.endswith("_norm"):
                p.add(b + hf + ".weight", g + gg + ".weight", (E,))
                p.add(b + hf + ".bias", g + gg + ".bias", (E,))
            else:
                p.add(b + hf + ".weight", g + gg + ".weight", shape)
    p.check_all_used("nomic-bert", ignored=(r"(^|\.)position_ids$", r"(^|\.)inv_freq$", r"^pooler\."))
    writer_keys += [("add_context_length", int(n_ctx)), ("add_embedding_length", E), ("add_block_count", L),
                    ("add_feed_forward_length", F), ("add_head_count", H),
                    ("add_layer_norm_eps", float(get("layer_norm_eps", "layer_norm_epsilon") or 1e-12)),
                    ("add_causal_attention", False), ("add_rope_freq_base", base), ("add_token_type_count", T),
                    ("add_vocab_size", V)]
    pooling = _pooling(os.path.dirname(path), "NomicBertModel")
    if pooling is not None:
        writer_keys.append(("add_pooling_type", pooling))
    return "nomic-bert", p.plans


def _nomic_moe(config, path, checkpoint, writer_keys, get, dims):
    """nomic-embed-text v2 MoE (nomic's own checkpoint names) -> "nomic-bert-moe", as llama.cpp's
    converter writes it: every moe_every_n_layers-th layer (i % n == 1) a mixture of GELU experts
    (megablocks' w1 [experts * n_inner, n_embd] and w2 of the same shape, not transposed), the others
    BERT's GELU feed-forward with biases. The experts' shared output bias, which llama.cpp drops,
    is kept as that layer's ffn_down.bias when it is not all zeros."""
    E, L, H, F = dims
    every, top_k = get("moe_every_n_layers"), get("moe_top_k")
    X = get("num_experts", "num_local_experts")
    if not all(isinstance(v, int) and v > 0 for v in (every, top_k, X)) or top_k > X:
        raise ConvertError(f"{path}: moe_every_n_layers, num_experts and moe_top_k (at most num_experts) must be "
                           "positive integers")
    act = get("activation_function", "hidden_act")
    if act != "gelu":
        raise ConvertError(f"{path}: unsupported activation '{act}' for nomic-bert-moe (expected gelu)")
    for flag in ("prenorm", "rotary_emb_interleaved", "moe_normalize_expert_weights", "causal"):
        if config.get(flag):
            raise ConvertError(f"{path}: nomic-bert-moe with {flag}={config[flag]} is not supported")
    for flag in ("qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias"):
        if config.get(flag) is False:
            raise ConvertError(f"{path}: nomic-bert-moe with {flag}=false is not supported")
    if config.get("rotary_emb_fraction", 1.0) != 1.0 or config.get("rotary_emb_scale_base") is not None:
        raise ConvertError(f"{path}: nomic-bert-moe with partial or scaled rotary embeddings is not supported")
    if E % H:
        raise ConvertError(f"{path}: n_head={H} does not divide n_embd={E}")
    V, T = get("vocab_size"), get("type_vocab_size") or 1
    n_pos, trained = get("n_positions", "max_position_embeddings") or 2048, get("max_trained_positions") or 2048
    n_ctx = 512 if (n_pos, trained) == (2048, 2048) else min(n_pos, trained)   # v2 MoE is trained on 512
    p = _Plans(checkpoint)
    p.add("embeddings.word_embeddings.weight", "token_embd.weight", (V, E))
    p.add("embeddings.token_type_embeddings.weight", "token_types.weight", (T, E))
    p.add("emb_ln.weight", "token_embd_norm.weight", (E,))
    p.add("emb_ln.bias", "token_embd_norm.bias", (E,))
    for i in range(L):
        b, g = f"encoder.layers.{i}.", f"blk.{i}."
        _expect(checkpoint, b + "attn.Wqkv.weight", (3 * E, E))
        _expect(checkpoint, b + "attn.Wqkv.bias", (3 * E,))
        qkv, qkv_b = checkpoint.load_f32(b + "attn.Wqkv.weight"), checkpoint.load_f32(b + "attn.Wqkv.bias")
        for k, name in enumerate(("attn_q", "attn_k", "attn_v")):
            p.add_data(g + name + ".weight", qkv[k * E:(k + 1) * E], b + "attn.Wqkv.weight")
            p.add_data(g + name + ".bias", qkv_b[k * E:(k + 1) * E], b + "attn.Wqkv.bias")
        for hf, gg, shape in (("attn.out_proj", "attn_output", (E, E)), ("norm1", "attn_output_norm", (E,)),
                              ("norm2", "layer_output_norm", (E,))):
            p.add(b + hf + ".weight", g + gg + ".weight", shape)
            p.add(b + hf + ".bias", g + gg + ".bias", shape[:1])
        if i % every != 1:
            for hf, gg, shape in (("mlp.fc1", "ffn_up", (F, E)), ("mlp.fc2", "ffn_down", (E, F))):
                p.add(b + hf + ".weight", g + gg + ".weight", shape)
                p.add(b + hf + ".bias", g + gg + ".bias", shape[:1])
            continue
        m = b + "mlp."
        p.add(m + "router.layer.weight", g + "ffn_gate_inp.weight", (X, E))
        for w in ("w1", "w2"):
            _expect(checkpoint, m + "experts.mlp." + w, (X * F, E))
        p.used.update((m + "experts.mlp.w1", m + "experts.mlp.w2"))
        up = lambda a: np.ascontiguousarray(a[0].reshape(X, F, E))  # noqa: E731
        down = lambda a: np.ascontiguousarray(a[0].reshape(X, F, E).transpose(0, 2, 1))  # noqa: E731
        p.plans.append(TensorPlan(None, g + "ffn_up_exps.weight", (X, F, E), inputs=(m + "experts.mlp.w1",),
                                  combine=up))
        p.plans.append(TensorPlan(None, g + "ffn_down_exps.weight", (X, E, F), inputs=(m + "experts.mlp.w2",),
                                  combine=down))
        _expect(checkpoint, m + "experts.bias", (E,))
        bias = checkpoint.load_f32(m + "experts.bias")
        if np.any(bias != 0):
            p.add_data(g + "ffn_down.bias", bias, m + "experts.bias")
        p.used.add(m + "experts.bias")
    p.check_all_used("nomic-bert-moe", ignored=(r"(^|\.)position_ids$", r"(^|\.)inv_freq$", r"^pooler\."))
    writer_keys += [("add_context_length", int(n_ctx)), ("add_embedding_length", E), ("add_block_count", L),
                    ("add_feed_forward_length", F), ("add_head_count", H),
                    ("add_layer_norm_eps", float(get("layer_norm_epsilon", "layer_norm_eps") or 1e-5)),
                    ("add_causal_attention", False),
                    ("add_rope_freq_base", float(get("rotary_emb_base", "rope_theta") or 10000.0)),
                    ("add_token_type_count", T), ("add_vocab_size", V), ("add_moe_every_n_layers", every),
                    ("add_expert_count", X), ("add_expert_used_count", top_k)]
    pooling = _pooling(os.path.dirname(path), "NomicBertModel")
    if pooling is not None:
        writer_keys.append(("add_pooling_type", pooling))
    return "nomic-bert-moe", p.plans


def _dense(model_dir, folder, n_in):
    """A sentence-transformers Dense module: its weight [out, in] (no bias, identity activation)."""
    cfg_path = os.path.join(model_dir, folder, "config.json")
    cfg = _read_json(cfg_path)
    if cfg.get("bias", True) or cfg.get("activation_function", "").split(".")[-1] not in ("Identity", ""):
        raise ConvertError(f"{cfg_path}: only Dense modules without bias and activation are supported")
    if cfg.get("in_features") != n_in:
        raise ConvertError(f"{cfg_path}: in_features {cfg.get('in_features')}, expected {n_in}")
    ck = Checkpoint(os.path.join(model_dir, folder))
    _expect(ck, "linear.weight", (cfg["out_features"], n_in))
    return ck.load_f32("linear.weight")


def _gemma_embedding(config, path, checkpoint, writer_keys):
    if not config.get("use_bidirectional_attention"):
        raise ConvertError(f"{path}: Gemma3TextModel without use_bidirectional_attention is not an embedding model "
                           "(convert Gemma3ForCausalLM for the language model)")
    spec = ARCHS["Gemma3ForCausalLM"]
    text = {**spec.defaults, **config, "use_bidirectional_attention": False}
    hp = read_hparams(text, spec, path)
    # Gemma3TextModel keeps its tensors without the causal LM's "model." prefix.
    renamed = _Renamed(checkpoint, {("model." + n if not n.startswith("model.") else n): n
                                    for n in checkpoint.names()})
    plans = plan_tensors(spec, hp, renamed)
    for pl in plans:
        if pl.hf_name is not None:
            pl.hf_name = renamed.map[pl.hf_name]
    model_dir = os.path.dirname(path)
    dense = [m for m in _st_modules(model_dir) if m.get("type", "").endswith("Dense")]
    if dense:
        if len(dense) != 2:
            raise ConvertError(f"{model_dir}: {len(dense)} Dense modules; EmbeddingGemma has two (2_Dense, 3_Dense)")
        d2 = _dense(model_dir, dense[0]["path"], hp.n_embd)
        d3 = _dense(model_dir, dense[1]["path"], d2.shape[0])
        if d3.shape[0] != hp.n_embd:
            raise ConvertError(f"{model_dir}: the last Dense module gives {d3.shape[0]} values, not {hp.n_embd}")
        plans.append(TensorPlan(None, "dense_2.weight", d2.shape, data=d2))
        plans.append(TensorPlan(None, "dense_3.weight", d3.shape, data=d3))
        writer_keys += [("add_dense_features_dims", "dense_2", d2.shape[1], d2.shape[0]),
                        ("add_dense_features_dims", "dense_3", d3.shape[1], d3.shape[0])]
    writer_keys.append(("add_hparams", spec, hp))
    writer_keys.append(("add_causal_attention", False))
    pooling = _pooling(model_dir, "Gemma3TextModel")
    if pooling is not None:
        writer_keys.append(("add_pooling_type", pooling))
    return "gemma-embedding", plans


def plan_encoder(model_dir, config, config_path):
    """(GGUF architecture, writer calls, tensor plans) of an encoder checkpoint; every tensor
    checked before anything is written."""
    name = config["architectures"][0]
    checkpoint = Checkpoint(model_dir)
    keys = []
    if name in _BERT:
        arch, plans = _bert(name, config, config_path, checkpoint, keys)
    elif name == "NomicBertModel":
        arch, plans = _nomic(config, config_path, checkpoint, keys)
    else:
        arch, plans = _gemma_embedding(config, config_path, checkpoint, keys)
    return arch, keys, plans, checkpoint


def write_keys(writer, keys):
    for method, *args in keys:
        if method == "add_hparams":
            add_hparams(writer, *args)
        elif method == "add_pooling_type":
            import gguf
            writer.add_pooling_type(gguf.PoolingType(args[0]))
        else:
            getattr(writer, method)(*args)
