"""A tiny random nomic-embed-text v2 MoE checkpoint in nomic's own (remote code) layout, which
transformers cannot build: 4 layers, the odd ones mixtures of 4 GELU experts, 2 chosen per token.
tests/reference/nomic_moe holds the float64 forward tools/gen_nomic_moe_reference.py computed on
it (its sha256 says which weights); the weights are drawn here from a seeded generator."""
import json
import os

import numpy as np

import hf_tiny
from encoder_tiny import SEQS  # noqa: F401  (the sequences the references were computed on)

REFERENCE = hf_tiny.ROOT / "tests" / "reference" / "nomic_moe"
E, H, F, L, X, TOP_K, EVERY, V = 64, 4, 96, 4, 4, 2, 2, 404
CONFIG = {
    "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "gelu",
    "n_embd": E, "n_head": H, "n_inner": F, "n_layer": L, "n_positions": 2048, "max_trained_positions": 2048,
    "vocab_size": V, "type_vocab_size": 1, "layer_norm_epsilon": 1e-5, "rotary_emb_base": 10000,
    "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
    "qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, "prenorm": False, "causal": False,
    "num_experts": X, "moe_top_k": TOP_K, "moe_every_n_layers": EVERY, "moe_normalize_expert_weights": False,
    "pad_token_id": 1,
}
SEED = 4101


def is_moe(i):
    return i % EVERY == 1


def shapes():
    s = {"embeddings.word_embeddings.weight": (V, E), "embeddings.token_type_embeddings.weight": (1, E),
         "emb_ln.weight": (E,), "emb_ln.bias": (E,)}
    for i in range(L):
        b = f"encoder.layers.{i}."
        s.update({b + "attn.Wqkv.weight": (3 * E, E), b + "attn.Wqkv.bias": (3 * E,),
                  b + "attn.out_proj.weight": (E, E), b + "attn.out_proj.bias": (E,),
                  b + "norm1.weight": (E,), b + "norm1.bias": (E,), b + "norm2.weight": (E,), b + "norm2.bias": (E,)})
        if is_moe(i):
            s.update({b + "mlp.router.layer.weight": (X, E), b + "mlp.experts.mlp.w1": (X * F, E),
                      b + "mlp.experts.mlp.w2": (X * F, E), b + "mlp.experts.bias": (E,)})
        else:
            s.update({b + "mlp.fc1.weight": (F, E), b + "mlp.fc1.bias": (F,), b + "mlp.fc2.weight": (E, F),
                      b + "mlp.fc2.bias": (E,)})
    return s


def weights():
    rng = np.random.default_rng(SEED)
    out = {}
    for name, shape in sorted(shapes().items()):
        x = rng.standard_normal(shape)
        if name.endswith(("norm1.weight", "norm2.weight", "emb_ln.weight")):
            x = 1.0 + 0.2 * x
        elif name.endswith("bias"):
            x = 0.1 * x
        elif "router" in name:
            x = 0.5 * x   # routing far from ties, so f32 rounding cannot change the chosen experts
        else:
            x = 0.08 * x
        out[name] = x.astype(np.float32)
    return out


def build(out_dir, zero_expert_bias=False):
    """Writes the checkpoint (config, safetensors, the bpe tokenizer, mean pooling) into out_dir;
    returns its tensors. zero_expert_bias: the experts' output bias all zeros (the form llama.cpp,
    which drops that bias, computes exactly)."""
    w = weights()
    if zero_expert_bias:
        for name in w:
            if name.endswith("experts.bias"):
                w[name] = np.zeros_like(w[name])
    hf_tiny.copy_tokenizer("bpe", out_dir)
    files = {"config.json": CONFIG,
             "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                              {"idx": 1, "name": "1", "path": "1_Pooling",
                               "type": "sentence_transformers.models.Pooling"}],
             "1_Pooling/config.json": {"word_embedding_dimension": E, "pooling_mode_mean_tokens": True}}
    for rel, data in files.items():
        os.makedirs(os.path.join(out_dir, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(out_dir, rel), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
    hf_tiny._write_safetensors(os.path.join(out_dir, "model.safetensors"), w, "float32")
    return w


def reference():
    """(the float64 reference's {name: array}, its metadata) as tests/reference/nomic_moe holds them."""
    with open(REFERENCE / "meta.json", encoding="utf-8") as f:
        meta = json.load(f)
    with np.load(REFERENCE / "outputs.npz") as z:
        return dict(z), meta
