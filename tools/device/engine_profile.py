#!/usr/bin/env python3
"""One engine decode step of B sequences for Nsight Compute, and the engine's own step timing.

    ncu --profile-from-start off ... engine_profile.py MODEL.gguf B      (kernels of one step)
    engine_profile.py MODEL.gguf B --wall                                 (ms per decode step)
    ncu --profile-from-start off ... engine_profile.py MODEL.gguf 1 --context   (a Context's step)

B requests of 128 prompt tokens decode until steady, then one decode step runs inside a profiler
range (cuProfilerStart/Stop) so ncu skips the prompts' kernels. --wall prints the engine's time
per decode step against a Context's (B = 1) to show the engine's own overhead.
"""
import ctypes
import sys
import time

import numpy as np

from ember import _ember as E


def main():
    path, batch = sys.argv[1], int(sys.argv[2])
    wall = "--wall" in sys.argv
    model = E.Model(path, n_gpu_layers=-1)
    driver = ctypes.CDLL("libcuda.so.1")
    if "--context" in sys.argv:
        profile_context_step(model, driver)
        return
    engine = E.Engine(model, n_ctx=300, max_num_seqs=batch, max_num_batched_tokens=max(512, 128 * batch),
                      kv_blocks=batch * 19)
    rng = np.random.default_rng(0)
    n_gen = 64 if wall else 12
    ids = [engine.add_request(rng.integers(0, model.n_vocab, 128).tolist(), temperature=0.0, max_tokens=n_gen,
                              min_tokens=n_gen, ignore_eos=True) for _ in range(batch)]
    seen, left, t0, s0, profiling = 0, set(ids), None, 0, False
    while left:
        for o in engine.poll(1.0):
            seen += len(o.token_ids)
            if o.finished:
                left.discard(o.request_id)
        steps = engine.stats()["steps"]
        # Timed from the fourth token on: the first decode steps of a length bucket run eagerly and
        # then record the step's graph (the Context below warms up past them too).
        if t0 is None and seen >= 4 * batch:
            first = engine.stats()
            t0, s0 = time.perf_counter(), first["steps"]
        if not wall and seen >= 6 * batch and not profiling:
            driver.cuProfilerStart()
            profiling = True
            s_prof = steps
        if profiling and steps > s_prof:
            driver.cuProfilerStop()
    stats = engine.stats()
    steps = stats["steps"] - s0
    dt = time.perf_counter() - t0
    print(f"engine B={batch}: {steps} steps, {1e3 * dt / max(steps, 1):.3f} ms/step, {batch * steps / dt:.1f} tok/s")
    phases = ("schedule", "forward", "sample", "output")
    print("  the loop's ms a decode step: " + ", ".join(
        f"{p} {1e3 * (stats['seconds_' + p] - first['seconds_' + p]) / max(steps, 1):.3f}" for p in phases))
    engine.close()
    if wall and batch == 1:
        ctx = E.Context(model, n_ctx=300, n_batch=512)
        ctx.eval(rng.integers(0, model.n_vocab, 128).tolist())
        for _ in range(8):
            ctx.eval([5])
        t = time.perf_counter()
        for _ in range(64):
            ctx.eval([5])
        print(f"context: {1e3 * (time.perf_counter() - t) / 64:.3f} ms/step")


def profile_context_step(model, driver):
    """One Context decode step after a 128-token prompt, inside a profiler range."""
    rng = np.random.default_rng(0)
    ctx = E.Context(model, n_ctx=300, n_batch=512)
    ctx.eval(rng.integers(0, model.n_vocab, 128).tolist())
    for _ in range(8):
        ctx.eval([5])
    driver.cuProfilerStart()
    ctx.eval([5])
    driver.cuProfilerStop()


if __name__ == "__main__":
    main()
