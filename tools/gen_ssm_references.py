"""Writes tests/reference/ssm_scan/mamba2.npz: what transformers' Mamba2 scan functions compute on
fixed random inputs (tests/test_ssm_scan.py holds Backend::ssm_scan to them).

    python tools/gen_ssm_references.py

Needs torch and transformers (5). Two cases per shape: a prompt through mamba2_chunk_scan (the
chunked SSD form a Mamba2 mixer runs on prompts, chunks of 16 so that several chunks and a padded
one are crossed) and the same tokens one by one through mamba2_selective_state_update (its decode
form), both from the same nonzero state, as Mamba2Mixer calls them: A = -exp(A_log), dt_bias and
softplus inside, D as the skip."""
import pathlib

import numpy as np
import torch
from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan, mamba2_selective_state_update

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference" / "ssm_scan" / "mamba2.npz"
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


def main():
    torch.manual_seed(0)
    arrays = {}
    for name, shape in SHAPES.items():
        for key, value in case(*shape).items():
            arrays[f"{name}/{key}"] = value
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
