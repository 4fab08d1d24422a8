"""ember-convert's chat families beyond the llama block, as llama.cpp's converter writes them:
Gemma 2 (soft-capping, alternating sliding windows), OLMo 2 / OLMo 3 (post-norms, full-width q/k
norms, OLMo 3's sliding windows), Granite (muP multipliers) and SmolLM3 (NoPE every fourth layer).
Each family gives a reader of its own config keys and, where its tensors differ from the llama
block's, an edit of the per-layer tensor map (convert_arch.ArchSpec's read_extra and layer_map)."""
from .convert_error import ConvertError


def _positive(config, key, path, what):
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConvertError(f"{path}: '{key}' must be a positive number ({what}), got {value!r}")
    return float(value)


def _sliding_layers(config, n_layer, default, path):
    """Which layers slide: config's layer_types, else default(i) for layer i."""
    types = config.get("layer_types")
    if types is None:
        return [default(i) for i in range(n_layer)]
    if len(types) != n_layer:
        raise ConvertError(f"{path}: 'layer_types' has {len(types)} entries, expected num_hidden_layers={n_layer}")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise ConvertError(f"{path}: unknown layer type {t!r} in 'layer_types'")
    return [t == "sliding_attention" for t in types]


def _period_or_list(sliding, default_period):
    """None when llama.cpp's default period holds (layer i slides iff i % p < p - 1); else another
    such period, else the per-layer list."""
    def fits(p):
        return sliding == [i % p < p - 1 for i in range(len(sliding))]
    if fits(default_period):
        return None
    return next((p for p in range(1, len(sliding) + 2) if fits(p)), list(sliding))


def read_gemma2(config, hp, path):
    if not hp.tied:
        raise ConvertError(f"{path}: tie_word_embeddings=false is not supported for gemma2 (the head is token_embd)")
    # llama.cpp's gemma2 always soft-caps (50 and 30 where the file has no key): a config without
    # caps has no GGUF spelling.
    hp.keys["attn_logit_softcapping"] = _positive(config, "attn_logit_softcapping", path, "llama.cpp always caps")
    hp.final_softcap = _positive(config, "final_logit_softcapping", path, "llama.cpp always caps")
    sliding = _sliding_layers(config, hp.n_layer, lambda i: (i + 1) % 2 != 0, path)
    if any(sliding):
        hp.n_swa = int(_positive(config, "sliding_window", path, "the window of the sliding layers"))
    hp.swa_pattern = _period_or_list(sliding, 2)
    scalar = _positive(config, "query_pre_attn_scalar", path, "queries are scaled by its inverse square root")
    # llama.cpp scales queries by 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the 46-layer 27B);
    # any other scalar needs the explicit key.
    expected = hp.n_embd // hp.n_head if hp.n_layer == 46 else hp.head_dim
    if scalar != expected:
        hp.attn_scale = scalar ** -0.5


def read_olmo2(config, hp, path):
    if config.get("sliding_window") is None:
        if "sliding_attention" in (config.get("layer_types") or []):
            raise ConvertError(f"{path}: sliding layers in 'layer_types' without a 'sliding_window'")
        return
    hp.n_swa = int(_positive(config, "sliding_window", path, "OLMo 3's window"))
    # llama.cpp's converter always writes OLMo 3's pattern as one bool per layer.
    hp.swa_pattern = _sliding_layers(config, hp.n_layer, lambda i: (i + 1) % 4 != 0, path)


def olmo2_layers(out, hp):
    """No norms before attention and the feed-forward; norms after both; q/k norms over all heads."""
    E, q, kv = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
    del out["input_layernorm.weight"]
    out["post_attention_layernorm.weight"] = ("post_attention_norm.weight", (E,), 0)
    out["post_feedforward_layernorm.weight"] = ("post_ffw_norm.weight", (E,), 0)
    out["self_attn.q_norm.weight"] = ("attn_q_norm.weight", (q,), 0)
    out["self_attn.k_norm.weight"] = ("attn_k_norm.weight", (kv,), 0)


def _no_windows(config, path, arch):
    if config.get("use_sliding_window") or "sliding_attention" in (config.get("layer_types") or []):
        raise ConvertError(f"{path}: sliding-window attention is not supported for {arch}")


def read_granite(config, hp, path):
    _no_windows(config, path, "granite")
    # As llama.cpp's converter: each multiplier written when the config sets it (and is not 0).
    if config.get("attention_multiplier"):
        hp.attn_scale = float(config["attention_multiplier"])
    for hf_key, gguf_key in (("embedding_multiplier", "embedding_scale"), ("residual_multiplier", "residual_scale")):
        if config.get(hf_key):
            hp.keys[gguf_key] = float(config[hf_key])
    hp.keys["logit_scale"] = _positive(config, "logits_scaling", path, "the logits are divided by it")


def read_smollm3(config, hp, path):
    _no_windows(config, path, "smollm3")
    # llama.cpp fixes SmolLM3's NoPE layers at every fourth (layer i has rope iff (i + 1) % 4 != 0)
    # and writes no key for them: any other layout cannot be written.
    interval = config.get("no_rope_layer_interval", 4)
    want = [int((i + 1) % 4 != 0) for i in range(hp.n_layer)]
    layers = config.get("no_rope_layers")
    if interval != 4 or (layers is not None and [int(x) for x in layers] != want):
        raise ConvertError(f"{path}: SmolLM3 files hold rope in every layer but each fourth (llama.cpp's fixed "
                           f"layout); this config's no_rope_layers / no_rope_layer_interval differ")
