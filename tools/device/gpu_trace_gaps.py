#!/usr/bin/env python3
"""One profiled step from an nsys cuda_gpu_trace CSV: its span from the first kernel's start to the
last one's end, the kernels' summed time, the idle gaps between them (largest first, with the
kernel after each), and the copies.

    gpu_trace_gaps.py TRACE.csv LABEL
"""
import csv
import sys


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    ops = sorted(((int(r["Start (ns)"]), int(r["Duration (ns)"]), r["Name"]) for r in rows), key=lambda x: x[0])
    if not ops:
        print(f"{label}: no GPU work in the trace")
        return
    kern = [o for o in ops if not o[2].startswith("[CUDA")]
    span = ops[-1][0] + ops[-1][1] - ops[0][0]
    busy = sum(d for _, d, _ in kern)
    gaps, end = [], None
    for start, dur, name in ops:
        if end is not None and start > end:
            gaps.append((start - end, name[:70]))
        end = max(end or 0, start + dur)
    print(f"{label}: {len(kern)} kernels, span {span / 1e3:.1f} us, kernels {busy / 1e3:.1f} us, "
          f"gaps {sum(g for g, _ in gaps) / 1e3:.1f} us in {len(gaps)}")
    for g, name in sorted(gaps, reverse=True)[:8]:
        print(f"  gap {g / 1e3:7.1f} us before {name}")
    for start, dur, name in ops:
        if name.startswith("[CUDA"):
            print(f"  {name} {dur / 1e3:.1f} us at +{(start - ops[0][0]) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
