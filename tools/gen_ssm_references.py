"""Writes tests/reference/ssm_scan/mamba2.npz: what transformers' Mamba2 scan functions and a whole
Mamba2Mixer compute on fixed random inputs (tests/test_ssm_scan.py holds Backend::ssm_scan, and a
mixer built from Backend::short_conv and Backend::ssm_scan, to them); and
tests/reference/short_conv/lfm2.npz: an LFM2 short-convolution block (tests/test_short_conv.py).

    python tools/gen_ssm_references.py

Needs torch and transformers (5). Two cases per shape: a prompt through mamba2_chunk_scan (the
chunked SSD form a Mamba2 mixer runs on prompts, chunks of 16 so that several chunks and a padded
one are crossed) and the same tokens one by one through mamba2_selective_state_update (its decode
form), both from the same nonzero state, as Mamba2Mixer calls them: A = -exp(A_log), dt_bias and
softplus inside, D as the skip. And one Mamba2Mixer with random weights over a prompt (no cache):
in_proj, the causal conv1d with its bias and SiLU, the scan, the gated grouped RMSNorm, out_proj.
The LFM2 block likewise: in_proj into B, C, x; the conv1d (no bias, no activation) of B * x; C times
it; out_proj."""
import pathlib

import numpy as np
import torch
from transformers import Lfm2Config, Mamba2Config
from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer, mamba2_chunk_scan, mamba2_selective_state_update

REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference"
OUT = REFERENCE / "ssm_scan" / "mamba2.npz"
OUT_LFM2 = REFERENCE / "short_conv" / "lfm2.npz"
# name: (n_head, head_dim, d_state, n_group, n_tok, seed)
SHAPES = {"groups2": (8, 16, 24, 2, 37, 1), "group1": (4, 8, 16, 1, 20, 2)}
CHUNK = 16


def case(n_head, head_dim, d_state, n_group, n_tok, seed):
    rng = np.random.default_rng(seed)
    f = np.float32
    x = rng.standard_normal((n_tok, n_head, head_dim)).astype(f)
    B, C = (rng.standard_normal((n_tok, n_group, d_state)).astype(f) for _ in range(2))
    dt = rng.uniform(-4, 1, (n_tok, n_head)).astype(f)
    A_log = np.log(rng.uniform(1, 16, n_head)).astype(f)
    dt_bias = rng.uniform(-1, 1, n_head).astype(f)
    D = rng.standard_normal(n_head).astype(f)
    state = (rng.standard_normal((n_head, head_dim, d_state)) * 0.5).astype(f)
    t = torch.from_numpy
    A = -torch.exp(t(A_log))
    y_chunked, s_chunked = mamba2_chunk_scan(t(x)[None], t(dt)[None], A, t(B)[None], t(C)[None], chunk_size=CHUNK,
                                             D=t(D), dt_bias=t(dt_bias), initial_states=t(state)[None],
                                             dt_softplus=True, return_final_states=True)
    s = t(state)[None].clone()
    steps = []
    for i in range(n_tok):
        steps.append(mamba2_selective_state_update(
            s, t(x[i])[None], t(dt[i])[None, :, None].expand(1, n_head, head_dim),
            A[:, None, None].expand(n_head, head_dim, d_state), t(B[i])[None], t(C[i])[None],
            t(D)[:, None].expand(n_head, head_dim), dt_bias=t(dt_bias)[:, None].expand(n_head, head_dim),
            dt_softplus=True))
    xbc = np.concatenate([x.reshape(n_tok, -1), B.reshape(n_tok, -1), C.reshape(n_tok, -1)], axis=1)
    return {"xbc": xbc, "dt": dt, "A": A.numpy().astype(f), "dt_bias": dt_bias, "D": D, "state": state,
            "y_chunked": y_chunked[0].reshape(n_tok, -1).numpy(), "state_chunked": s_chunked[0].numpy(),
            "y_steps": torch.cat(steps).reshape(n_tok, -1).numpy(), "state_steps": s[0].numpy(),
            "n_group": np.int32(n_group)}


def mixer(seed=3, n_tok=21):
    """A Mamba2Mixer (6 heads of 16, states of 16, 2 groups, kernel 4) with every weight drawn."""
    cfg = Mamba2Config(hidden_size=48, state_size=16, expand=2, num_heads=6, head_dim=16, n_groups=2, conv_kernel=4,
                       use_conv_bias=True, chunk_size=8, layer_norm_epsilon=1e-5, num_hidden_layers=1, vocab_size=16)
    torch.manual_seed(seed)
    m = Mamba2Mixer(cfg, 0)
    with torch.no_grad():
        for w in (m.in_proj.weight, m.conv1d.weight, m.conv1d.bias, m.out_proj.weight):
            w.copy_(torch.randn_like(w) / w.shape[-1] ** 0.5)
        m.A_log.copy_(torch.log(torch.rand(cfg.num_heads) * 15 + 1))
        m.dt_bias.copy_(torch.rand(cfg.num_heads) * 2 - 1)
        m.D.copy_(torch.randn(cfg.num_heads))
        m.norm.weight.copy_(torch.rand(m.intermediate_size) + 0.5)
        hidden = torch.randn(1, n_tok, cfg.hidden_size)
        out = m(hidden)[0]
    def a(t):
        return t.detach().numpy().astype(np.float32)

    return {"hidden": a(hidden[0]), "out": a(out), "in_proj": a(m.in_proj.weight), "conv_w": a(m.conv1d.weight[:, 0]),
            "conv_b": a(m.conv1d.bias), "A": a(-torch.exp(m.A_log)), "dt_bias": a(m.dt_bias), "D": a(m.D),
            "norm": a(m.norm.weight), "out_proj": a(m.out_proj.weight),
            "shape": np.array([cfg.num_heads, cfg.head_dim, cfg.state_size, cfg.n_groups], np.int32),
            "eps": np.float32(cfg.layer_norm_epsilon)}


def lfm2_block(seed=4, n_tok=17):
    """LFM2's short-convolution block (width 40, kernel 3, no biases) with every weight drawn."""
    cfg = Lfm2Config(hidden_size=40, conv_L_cache=3, conv_bias=False, num_hidden_layers=1, layer_types=["conv"],
                     vocab_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    torch.manual_seed(seed)
    m = Lfm2ShortConv(cfg, 0)
    with torch.no_grad():
        for w in (m.in_proj.weight, m.conv.weight, m.out_proj.weight):
            w.copy_(torch.randn_like(w) / w.shape[-1] ** 0.5)
        hidden = torch.randn(1, n_tok, cfg.hidden_size)
        out = m(hidden)[0]
    return {"hidden": hidden[0].numpy(), "out": out.numpy(), "in_proj": m.in_proj.weight.detach().numpy(),
            "conv_w": m.conv.weight[:, 0].detach().numpy(), "out_proj": m.out_proj.weight.detach().numpy()}


def main():
    torch.manual_seed(0)
    arrays = {}
    for name, shape in SHAPES.items():
        for key, value in case(*shape).items():
            arrays[f"{name}/{key}"] = value
    for key, value in mixer().items():
        arrays[f"mixer/{key}"] = value
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    OUT_LFM2.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT_LFM2, **lfm2_block())
    print(f"wrote {OUT_LFM2} ({OUT_LFM2.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
