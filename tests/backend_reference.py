"""numpy references for the backend ops (float64), shared by the CPU and CUDA op tests."""
import numpy as np


def rmsnorm(x, gamma, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * gamma


def rope(x, pos, n_heads, head_dim, base, neox):
    x = x.astype(np.float64).reshape(len(pos), n_heads, head_dim).copy()
    half = head_dim // 2
    theta = np.asarray(pos, dtype=np.float64)[:, None] * base ** (-2.0 * np.arange(half) / head_dim)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:].copy()
        x[..., :half], x[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
    return x.reshape(len(pos), n_heads * head_dim)


def swiglu(g, u):
    g = g.astype(np.float64)
    return g / (1 + np.exp(-g)) * u


def attention(q, k_all, v_all, pos, n_head, n_head_kv, head_dim):
    """Causal attention of queries at positions pos over keys/values 0..pos (GQA)."""
    group = n_head // n_head_kv
    out = np.zeros((len(pos), n_head * head_dim))
    for t, p in enumerate(pos):
        for h in range(n_head):
            kh = h // group
            qh = q[t, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            k = k_all[:p + 1, kh * head_dim:(kh + 1) * head_dim].astype(np.float64)
            v = v_all[:p + 1, kh * head_dim:(kh + 1) * head_dim].astype(np.float64)
            s = k @ qh / np.sqrt(head_dim)
            w = np.exp(s - s.max())
            out[t, h * head_dim:(h + 1) * head_dim] = (w / w.sum()) @ v
    return out
