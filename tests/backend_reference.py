"""numpy references for the backend ops (float64), shared by the CPU and CUDA op tests."""
import gguf
import numpy as np


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def iq4_nl_round(x):
    """x as ggml's reference IQ4_NL quantizer (its iq4_nl KV cache's) stores it, and back: per block of 32,
    id = 1 / (max / -127) from the value of largest magnitude, each value to the nearest level of id * x
    (a tie to the upper one), d the float32 least-squares fit with weights x^2 (sums in order), as f16."""
    b = x.reshape(-1, 32).astype(np.float32)
    mx = b[np.arange(len(b)), np.argmax(np.abs(b), axis=1)]
    live = np.abs(mx) >= np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        al = np.where(live, np.float32(1) / (mx / np.float32(-127)), np.float32(0))[:, None] * b
    v = IQ4_NL_LEVELS
    hi = np.clip(np.searchsorted(v, al, side="right"), 1, 15)
    idx = np.where((al - v[hi - 1]) < (v[hi] - al), hi - 1, hi)
    idx = np.where(al <= v[0], 0, np.where(al >= v[15], 15, idx))
    q, w = v[idx], b * b
    sumqx, sumq2 = np.cumsum(w * q * b, axis=1)[:, -1], np.cumsum(w * q * q, axis=1)[:, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(live & (sumq2 > 0), sumqx / sumq2, np.float32(0)).astype(np.float32)
    return (d.astype(np.float16).astype(np.float32)[:, None] * q).reshape(x.shape)


def kv_round(x, kv_type):
    """x [rows, width] as a KV cache of kv_type ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1",
    "q5_0", "q5_1", "iq4_nl") holds it (all but f32 and f16: ggml's rounding and back, through the gguf
    package; iq4_nl, which gguf does not quantize, through iq4_nl_round)."""
    if kv_type == "f32":
        return x
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kv_type == "iq4_nl":
        return iq4_nl_round(x)
    t = gguf.GGMLQuantizationType[kv_type.upper()]
    return gguf.quants.dequantize(gguf.quants.quantize(x, t), t).reshape(x.shape).astype(np.float32)


def rmsnorm(x, gamma, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * gamma


def head_rmsnorm(x, gamma, n_heads, head_dim, eps):
    """Each head of each row normed on its own: x [n_tok, n_heads * head_dim], gamma [head_dim]."""
    h = x.astype(np.float64).reshape(-1, head_dim)
    return (h / np.sqrt((h * h).mean(axis=1, keepdims=True) + eps) * gamma).reshape(x.shape)


def rmsnorm_grouped(x, gamma, n_groups, eps):
    """Each of the n_groups equal groups of each row normed on its own, then scaled by its part of
    gamma: x [n_rows, width], gamma [width] (Mamba2's norm after its gate)."""
    h = x.astype(np.float64).reshape(x.shape[0], n_groups, -1)
    h = h / np.sqrt((h * h).mean(axis=2, keepdims=True) + eps)
    return h.reshape(x.shape) * gamma


def rope_angles(pos, head_dim, base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, corr_lo=0.0, corr_hi=0.0,
                freq_factors=None):
    """cos, sin [len(pos), head_dim / 2] of every pair: base^(-2i/d) per position, divided by the
    pair's frequency factor; linear scaling multiplies by freq_scale; YaRN ramps each pair between
    the interpolated angle (pairs above corr_hi) and the extrapolated one (below corr_lo) and
    scales the magnitude by 1 + 0.1 ln(1 / freq_scale)."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    theta = np.asarray(pos, dtype=np.float64)[:, None] * base ** (-2.0 * i / head_dim)
    if freq_factors is not None:
        theta = theta / np.asarray(freq_factors, dtype=np.float64)
    angle, mscale = freq_scale * theta, attn_factor
    if ext_factor != 0.0:
        ramp = (1.0 - np.clip((i - corr_lo) / max(0.001, corr_hi - corr_lo), 0.0, 1.0)) * ext_factor
        angle = angle * (1.0 - ramp) + theta * ramp
        mscale = mscale * (1.0 + 0.1 * np.log(1.0 / freq_scale))
    return np.cos(angle) * mscale, np.sin(angle) * mscale


def rope_scalings(hd, rng):
    """Random parameters of each rope scaling a GGUF can ask for (src/backend/rope_angles.h)."""
    lo = float(rng.integers(0, hd // 4))
    return {
        "freq_factors": {"freq_factors": rng.uniform(1, 8, hd // 2).astype(np.float32)},
        "linear": {"freq_scale": float(rng.uniform(0.1, 0.9))},
        "yarn": {"freq_scale": float(rng.uniform(0.1, 0.5)), "ext_factor": 1.0,
                 "attn_factor": float(rng.uniform(0.8, 1.2)),
                 "corr_lo": lo, "corr_hi": lo + float(rng.integers(2, hd // 4))},
    }


def rope(x, pos, n_heads, head_dim, base, neox, n_rot=0, **scaling):
    """Each head's first n_rot dimensions (0: all) rotate as a head of n_rot would; the rest pass
    through (partial rotary)."""
    x = x.astype(np.float64).reshape(len(pos), n_heads, head_dim).copy()
    rot = n_rot or head_dim
    half = rot // 2
    c, s = rope_angles(pos, rot, base, **scaling)
    c, s = c[:, None, :], s[:, None, :]
    r = x[..., :rot]
    if neox:
        a, b = r[..., :half].copy(), r[..., half:].copy()
        r[..., :half], r[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = r[..., 0::2].copy(), r[..., 1::2].copy()
        r[..., 0::2], r[..., 1::2] = a * c - b * s, a * s + b * c
    return x.reshape(len(pos), n_heads * head_dim)


def attn_temperature(q, pos, temp_scale, temp_length, temp_offset=0):
    """Row t of q times 1 + temp_scale * ln(1 + floor((pos[t] + temp_offset) / temp_length)) (llama 4
    counts from 1, Mistral 3 from 0)."""
    p = np.asarray(pos, dtype=np.float64) + temp_offset
    return q.astype(np.float64) * (1.0 + temp_scale * np.log(1.0 + np.floor(p / temp_length)))[:, None]


def silu(g):
    g = np.clip(g.astype(np.float64), -700, 700)
    return g / (1 + np.exp(-g))


def gelu_tanh(g):
    g = g.astype(np.float64)
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))


def swiglu_clamped(g, u):
    """gpt-oss's: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)."""
    g = np.minimum(g.astype(np.float64), 7.0)
    return g / (1 + np.exp(-1.702 * g)) * (np.clip(u.astype(np.float64), -7.0, 7.0) + 1)


def gated_act(g, u, act="silu"):
    if act == "swiglu_clamped":
        return swiglu_clamped(g, u)
    return {"silu": silu, "gelu_tanh": gelu_tanh}[act](g) * u


def moe_route(logits, n_used, gating="softmax", norm_topk=False, weight_scale=1.0, selection_bias=None, n_group=0,
              n_group_used=0):
    """Each row's experts (descending selection score, ties to the lower index) and weights. n_group > 1:
    only the experts of the n_group_used groups whose two best selection scores sum highest (ties to the
    lower group; a softmax's scores are its probabilities there) can be chosen."""
    logits = np.asarray(logits, dtype=np.float64)
    ids, weights = [], []
    for row in logits:
        if gating == "sigmoid":
            score = 1 / (1 + np.exp(-row))
            choose = score + (0.0 if selection_bias is None else np.asarray(selection_bias, np.float64))
        else:
            score = np.exp(row - row.max())
            score, choose = score / score.sum(), row
        if n_group > 1:
            choose = (score if gating == "softmax" else choose).copy()
            per = len(row) // n_group
            sums = [sum(sorted(choose[g * per:(g + 1) * per])[-2:]) for g in range(n_group)]
            for g in sorted(range(n_group), key=lambda g: (-sums[g], g))[n_group_used:]:
                choose[g * per:(g + 1) * per] = -np.inf
        top = sorted(range(len(row)), key=lambda e: (-choose[e], e))[:n_used]
        w = score[top]
        if gating == "topk_softmax":
            w = np.exp(row[top] - row[top].max())
            w = w / w.sum()
        if norm_topk:
            w = w / w.sum()
        ids.append(top)
        weights.append(w * weight_scale)
    return np.array(ids, dtype=np.int32), np.array(weights)


def moe(x, router, gate, up, down, n_used, gating="softmax", norm_topk=False, weight_scale=1.0, act="silu",
        router_bias=None, selection_bias=None, gate_bias=None, up_bias=None, down_bias=None, shared=None,
        shared_gate_inp=None, weight_input=False):
    """The mixture's feed-forward on normed rows x [n_tok, n_embd] with dequantized weights: router
    [n_expert, n_embd]; gate, up [n_expert, n_ff, n_embd]; down [n_expert, n_embd, n_ff]; biases
    [n_expert, width]; shared (gate, up, down) of the shared expert, scaled by sigmoid(shared_gate_inp
    . x) where given. weight_input: each chosen weight scales the expert's input, not its output (llama 4)."""
    x = np.asarray(x, dtype=np.float64)
    logits = x @ np.asarray(router, np.float64).T + (0.0 if router_bias is None else router_bias)
    chosen, weights = moe_route(logits, n_used, gating, norm_topk, weight_scale, selection_bias)
    out = np.zeros_like(x)
    for t in range(len(x)):
        for e, w in zip(chosen[t], weights[t]):
            xe = w * x[t] if weight_input else x[t]
            g = gate[e].astype(np.float64) @ xe + (0.0 if gate_bias is None else gate_bias[e])
            u = up[e].astype(np.float64) @ xe + (0.0 if up_bias is None else up_bias[e])
            y = down[e].astype(np.float64) @ gated_act(g, u, act) + (0.0 if down_bias is None else down_bias[e])
            out[t] += y if weight_input else w * y
    if shared is not None:
        sg, su, sd = (np.asarray(m, np.float64) for m in shared)
        y = gated_act(x @ sg.T, x @ su.T, act) @ sd.T
        if shared_gate_inp is not None:
            y = y / (1 + np.exp(-(x @ np.asarray(shared_gate_inp, np.float64))))[:, None]
        out += y
    return out


def attention(q, k_all, v_all, pos, n_head, n_head_kv, head_dim, window=0, sinks=None, softcap=0.0, chunk=0):
    """Causal attention of queries at positions pos over keys/values 0..pos (GQA); window > 0:
    over p - window < j <= p only; chunk > 0: over the keys of p's chunk only (p - p % chunk <= j
    <= p). sinks [n_head]: each head's extra softmax logit, which takes probability mass and adds no
    value (gpt-oss). softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) (Gemma 2)."""
    group = n_head // n_head_kv
    out = np.zeros((len(pos), n_head * head_dim))
    for t, p in enumerate(pos):
        first = max(0, p - window + 1) if window > 0 else p - p % chunk if chunk > 0 else 0
        for h in range(n_head):
            kh = h // group
            qh = q[t, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            k = k_all[first:p + 1, kh * head_dim:(kh + 1) * head_dim].astype(np.float64)
            v = v_all[first:p + 1, kh * head_dim:(kh + 1) * head_dim].astype(np.float64)
            s = k @ qh / np.sqrt(head_dim)
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            w = np.exp(s - m)
            denom = w.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
            out[t, h * head_dim:(h + 1) * head_dim] = (w / denom) @ v
    return out


def scale_softcap(x, scale, cap):
    """x * scale, then cap * tanh(x / cap) where cap > 0 (Granite's scales, Gemma 2's final soft-cap)."""
    y = np.asarray(x, np.float64) * scale
    return cap * np.tanh(y / cap) if cap > 0 else y


def greedy_ids(x):
    """Each row's first highest value's index, ignoring NaN; -1 where nothing beats -inf."""
    out = []
    for row in np.asarray(x, dtype=np.float32):
        vals = np.where(np.isnan(row), -np.inf, row)
        best = int(np.argmax(vals))
        out.append(best if vals[best] > -np.inf else -1)
    return out


def argmax_cases(rng, width):
    """Rows for argmax_rows: random, ties (the first must win), NaN and +-inf, nothing above -inf."""
    x = rng.standard_normal((9, width)).astype(np.float32)
    x[1, [5, width // 2, width - 1]] = 50.0                      # a tie: index 5 wins
    x[2, :] = 0.0                                                # all equal: index 0
    x[3, [0, 7]] = np.nan                                        # NaN never wins
    x[3, 9] = 40.0
    x[4, :] = -np.inf                                            # nothing to draw: -1
    x[5, :] = np.nan                                             # nothing to draw: -1
    x[6, [11, 3]] = np.inf                                       # +inf: the first one
    x[7, :] = -np.inf
    x[7, width - 1] = -3.0e38                                    # only the last one is finite
    x[8, :] = rng.standard_normal(width).astype(np.float32) * 1e-30
    return x


def layernorm(x, gamma, beta, eps):
    """(x - mean) / sqrt(var + eps) * gamma (+ beta) per row, in float64."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * gamma
    return y if beta is None else y + beta


def unary(x, f):
    """gelu_erf (BERT's exact GELU), gelu_tanh, tanh or relu_squared (max(x, 0)^2) of each element, in float64."""
    from math import erf
    x = np.asarray(x, np.float64)
    if f == "gelu_erf":
        return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))
    if f == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    if f == "relu_squared":
        return np.maximum(x, 0.0) ** 2
    return np.tanh(x)


def encoder_attention(q, k, v, pos, seq, n_head, n_head_kv, head_dim, scale, window=0):
    """Bidirectional attention: token t sees every token of its own sequence (within |pos| < window
    when window > 0); GQA head h reads kv head h // (n_head // n_head_kv). float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    pos, seq = np.asarray(pos), np.asarray(seq)
    out = np.zeros_like(q)
    group = n_head // n_head_kv
    for t in range(q.shape[0]):
        seen = seq == seq[t]
        if window > 0:
            seen &= np.abs(pos - pos[t]) < window
        for h in range(n_head):
            g = h // group
            kh = k[seen, g * head_dim:(g + 1) * head_dim]
            vh = v[seen, g * head_dim:(g + 1) * head_dim]
            s = kh @ q[t, h * head_dim:(h + 1) * head_dim] * scale
            w = np.exp(s - s.max())
            out[t, h * head_dim:(h + 1) * head_dim] = (w / w.sum()) @ vh
    return out


def _delta_rule_heads(q, k, v, g, beta, state, n_k_heads):
    """Per v head (tiled: v head h reads q, k head h % n_k_heads): q normalized and scaled, k
    normalized, v, g, beta, in float64, [n_v_heads, n_tok, ...]."""
    n_v, hk, hv = state.shape
    n_tok = len(q)

    def l2(x):
        x = np.asarray(x, np.float64).reshape(n_tok, n_k_heads, hk)
        x = x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
        return x[:, np.arange(n_v) % n_k_heads].transpose(1, 0, 2)

    vh = np.asarray(v, np.float64).reshape(n_tok, n_v, hv).transpose(1, 0, 2)
    gh, bh = (np.asarray(a, np.float64).reshape(n_tok, n_v).T for a in (g, beta))
    return l2(q) / np.sqrt(hk), l2(k), vh, gh, bh


def gated_delta_rule(q, k, v, g, beta, state, n_k_heads):
    """The gated delta rule token by token (transformers' torch_recurrent_gated_delta_rule with
    use_qk_l2norm_in_kernel): per v head, S = exp(g) S; S += k (beta (v - S^T k))^T; out = S^T q.
    state [n_v_heads, head_k, head_v]. Returns (out [n_tok, n_v_heads * head_v], the new state)."""
    qh, kh, vh, gh, bh = _delta_rule_heads(q, k, v, g, beta, state, n_k_heads)
    S = np.array(state, np.float64)
    out = np.zeros_like(vh)
    for t in range(len(q)):
        for h in range(len(S)):
            S[h] *= np.exp(gh[h, t])
            S[h] += np.outer(kh[h, t], bh[h, t] * (vh[h, t] - S[h].T @ kh[h, t]))
            out[h, t] = S[h].T @ qh[h, t]
    return out.transpose(1, 0, 2).reshape(len(q), -1), S


def gated_delta_rule_chunked(q, k, v, g, beta, state, n_k_heads, chunk=64):
    """The same rule in transformers' chunked form (torch_chunk_gated_delta_rule): within a chunk,
    the delta updates solved as one unit lower triangular system (the UT transform), then the state
    carried from chunk to chunk. Equal to gated_delta_rule up to rounding."""
    qh, kh, vh, gh, bh = _delta_rule_heads(q, k, v, g, beta, state, n_k_heads)
    n_tok = len(q)
    S = np.array(state, np.float64)
    out = np.zeros_like(vh)
    for h in range(len(S)):
        for c0 in range(0, n_tok, chunk):
            sl = slice(c0, min(c0 + chunk, n_tok))
            qc, kc, vc, bc = qh[h, sl], kh[h, sl], vh[h, sl], bh[h, sl]
            cum = np.cumsum(gh[h, sl])
            n = len(cum)
            lower = np.tril(np.ones((n, n), bool))
            decay = np.where(lower, np.exp(np.where(lower, cum[:, None] - cum[None, :], 0.0)), 0.0)
            kb = kc * bc[:, None]
            system = np.eye(n) + np.tril((kb @ kc.T) * decay, -1)
            u = np.linalg.solve(system, vc * bc[:, None])
            w = np.linalg.solve(system, kb * np.exp(cum)[:, None])
            v_new = u - w @ S[h]
            out[h, sl] = (qc * np.exp(cum)[:, None]) @ S[h] + ((qc @ kc.T) * decay) @ v_new
            S[h] = S[h] * np.exp(cum[-1]) + (kc * np.exp(cum[-1] - cum)[:, None]).T @ v_new
    return out.transpose(1, 0, 2).reshape(n_tok, -1), S


def short_conv(x, w, bias, state, silu_out):
    """The causal depthwise convolution with its carried state: xin = state rows then x rows,
    y[t] = bias + sum_j w[:, j] * xin[t + j], then SiLU if silu_out. Returns (y, the last
    kernel - 1 rows of xin: the new state)."""
    kernel = w.shape[1]
    xin = np.concatenate([np.asarray(state, np.float64), np.asarray(x, np.float64)])
    w = np.asarray(w, np.float64)
    y = sum(w[:, j] * xin[j:j + len(x)] for j in range(kernel))
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if silu_out:
        y = silu(y)
    return y, xin[len(xin) - (kernel - 1):]


def softplus(x):
    x = np.asarray(x, np.float64)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def ssm_scan(xbc, dt, A, dt_bias, D, state, n_group):
    """Mamba2's selective scan token by token (the paper's recurrence, transformers'
    mamba2_selective_state_update): per head h, with B and C of group h // (n_head // n_group),
    d = softplus(dt + dt_bias); S = exp(d A) S + d x B^T; y = S C + D x. xbc rows hold x, then B, then
    C; state [n_head, head_dim, d_state]. Returns (y [n_tok, n_head * head_dim], the new state)."""
    n_head, head_dim, d_state = state.shape
    n_tok, inner = len(xbc), n_head * head_dim
    xbc = np.asarray(xbc, np.float64)
    x = xbc[:, :inner].reshape(n_tok, n_head, head_dim)
    heads = np.arange(n_head) // (n_head // n_group)
    B = xbc[:, inner:inner + n_group * d_state].reshape(n_tok, n_group, d_state)[:, heads]
    C = xbc[:, inner + n_group * d_state:].reshape(n_tok, n_group, d_state)[:, heads]
    d = softplus(np.asarray(dt, np.float64) + (0 if dt_bias is None else np.asarray(dt_bias, np.float64)))
    A = np.asarray(A, np.float64)
    S = np.array(state, np.float64)
    y = np.zeros((n_tok, n_head, head_dim))
    for t in range(n_tok):
        S = S * np.exp(d[t] * A)[:, None, None] + (d[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", S, C[t])
        if D is not None:
            y[t] += np.asarray(D, np.float64)[:, None] * x[t]
    return y.reshape(n_tok, inner), S
