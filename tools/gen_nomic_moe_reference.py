"""Writes tests/reference/nomic_moe: the float64 forward of the tiny nomic-embed-text v2 MoE
checkpoint (tests/nomic_moe_tiny.py) on encoder_tiny.SEQS, computed here in numpy from the math of
nomic's remote code (NomicBertModel with moe_every_n_layers), which transformers does not ship.

    PYTHONPATH=python:tests python tools/gen_nomic_moe_reference.py

The forward: embeddings (word + token type 0) -> LayerNorm; each layer post-norm: x = LN(x + attn(x)),
attention from the fused Wqkv with bias, rotary on each head's halves (not interleaved), bidirectional;
then x = LN(x + mlp(x)), mlp GELU(fc1 x) -> fc2 with biases, or on layers i % moe_every_n_layers == 1
the mixture: softmax over the router's logits, the moe_top_k largest probabilities kept as they are
(not renormalized), each chosen expert GELU(x w1_e^T) w2_e, their weighted sum plus the experts' bias."""
import hashlib
import json
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import nomic_moe_tiny as tiny  # noqa: E402

_erf = np.vectorize(math.erf)


def layernorm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def rotary(x, base):
    """x [T, H, D]: each head's first and second halves rotated as pairs (GPT-NeoX's layout)."""
    T, _, D = x.shape
    inv = base ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(w, ids):
    """(last hidden state [T, E], the smallest gap between the last chosen and the first refused
    expert's router logit over the mixture layers' tokens)."""
    c = tiny.CONFIG
    E, H, F, X, K, eps = c["n_embd"], c["n_head"], c["n_inner"], c["num_experts"], c["moe_top_k"], \
        c["layer_norm_epsilon"]
    D = E // H
    g = {k: v.astype(np.float64) for k, v in w.items()}
    x = g["embeddings.word_embeddings.weight"][ids] + g["embeddings.token_type_embeddings.weight"][0]
    x = layernorm(x, g["emb_ln.weight"], g["emb_ln.bias"], eps)
    T, margin = len(ids), np.inf
    for i in range(c["n_layer"]):
        b = f"encoder.layers.{i}."
        qkv = x @ g[b + "attn.Wqkv.weight"].T + g[b + "attn.Wqkv.bias"]
        q, k, v = (qkv[:, j * E:(j + 1) * E].reshape(T, H, D) for j in range(3))
        q, k = rotary(q, c["rotary_emb_base"]), rotary(k, c["rotary_emb_base"])
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        att = np.einsum("hts,shd->thd", p, v).reshape(T, E)
        x = layernorm(x + att @ g[b + "attn.out_proj.weight"].T + g[b + "attn.out_proj.bias"],
                      g[b + "norm1.weight"], g[b + "norm1.bias"], eps)
        if tiny.is_moe(i):
            logits = x @ g[b + "mlp.router.layer.weight"].T
            prob = np.exp(logits - logits.max(axis=-1, keepdims=True))
            prob /= prob.sum(axis=-1, keepdims=True)
            w1 = g[b + "mlp.experts.mlp.w1"].reshape(X, F, E)
            w2 = g[b + "mlp.experts.mlp.w2"].reshape(X, F, E)
            y = np.zeros_like(x)
            for t in range(T):
                order = np.argsort(-prob[t], kind="stable")
                margin = min(margin, logits[t, order[K - 1]] - logits[t, order[K]])
                for e in order[:K]:
                    y[t] += prob[t, e] * (gelu(x[t] @ w1[e].T) @ w2[e])
            y += g[b + "mlp.experts.bias"]
        else:
            y = gelu(x @ g[b + "mlp.fc1.weight"].T + g[b + "mlp.fc1.bias"]) @ g[b + "mlp.fc2.weight"].T
            y += g[b + "mlp.fc2.bias"]
        x = layernorm(x + y, g[b + "norm2.weight"], g[b + "norm2.bias"], eps)
    return x, margin


def main():
    w = tiny.weights()
    digest = hashlib.sha256()
    for name in sorted(w):
        digest.update(name.encode() + w[name].tobytes())
    arrays, margin = {}, np.inf
    for i, ids in enumerate(tiny.SEQS):
        hidden, m = forward(w, np.asarray(ids))
        margin = min(margin, m)
        arrays[f"hidden_{i}"] = hidden
        arrays[f"pooled_{i}"] = hidden.mean(axis=0)
    assert margin > 1e-3, f"routing too close to a tie ({margin:.2e}) for an f32 comparison: pick another seed"
    out = tiny.REFERENCE
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "outputs.npz", **arrays)
    meta = {"weights_sha256": digest.hexdigest(), "n_seqs": len(tiny.SEQS), "routing_margin": float(f"{margin:.3e}")}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(arrays)} arrays, smallest routing margin {margin:.3e}")


if __name__ == "__main__":
    main()
