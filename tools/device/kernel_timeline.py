#!/usr/bin/env python3
"""Where a decode step's wall time goes, from a kernel_trace.c CSV (kernels as they ran, graphs
and programmatic dependent launch included).

    kernel_timeline.py TRACE.csv[.gz] [STEPS]

A step starts at each copy_from_pinned_kernel (the step's uploads, its first node); steps with an
argmax_rows kernel are the engine's, the others a Context's. For each kind, over its last STEPS
(default 16) steps of the most common kernel count: the step's span and the gap to the next step,
then per kernel name the median time it adds to the step's critical path (its end minus the
latest end before it: what the step would lose without it) and its median duration (start to end;
with PDL a kernel starts early and waits, so durations overlap), and one middle layer in order.
"""
import collections
import csv
import gzip
import re
import shutil
import statistics
import subprocess
import sys


def short_names(names):
    """Mangled kernel names -> 'gemv_kernel<FmtQ4_0, 1>'-like short names (c++filt where present)."""
    names = sorted(set(names))
    demangled = names
    if shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        demangled = out[:len(names)]
    short = {}
    for m, d in zip(names, demangled):
        d = re.sub(r"ember::|cuda::|\(anonymous namespace\)::", "", d)
        if d.endswith(")"):   # the parameter list
            depth = 0
            for i in range(len(d) - 1, -1, -1):
                depth += {")": 1, "(": -1}.get(d[i], 0)
                if depth == 0:
                    d = d[:i]
                    break
        d = re.sub(r"^void ", "", d)
        short[m] = d[:60]
    return short


def median(xs):
    return statistics.median(xs) if xs else 0.0


def main():
    path = sys.argv[1]
    n_last = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:   # kernel_trace.sh keeps it gzipped
        rows = [(int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in csv.DictReader(f)]
    rows.sort()
    short = short_names(r[2] for r in rows)
    steps, cur = [], None
    for start, end, name in rows:
        n = short[name]
        if n.startswith("copy_from_pinned_kernel"):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((start, end, n))
    engine_step = [any(k[2].startswith("argmax_rows") for k in s) for s in steps]
    for kind, pick in (("engine", True), ("context", False)):
        mine = [i for i in range(len(steps)) if engine_step[i] == pick]
        if not mine:
            continue
        common = collections.Counter(len(steps[i]) for i in mine).most_common(1)[0][0]
        idx = [i for i in mine if len(steps[i]) == common][-n_last - 1:-1]
        if not idx:
            continue
        spans, gaps = [], []
        add = collections.defaultdict(list)
        dur = collections.defaultdict(list)
        per_pos = [([], [], []) for _ in range(common)]
        for i in idx:
            s = steps[i]
            spans.append(s[-1][1] - s[0][0])
            if i + 1 < len(steps):
                gaps.append(steps[i + 1][0][0] - max(k[1] for k in s))
            latest = s[0][0]
            step_add = collections.Counter()
            step_dur = collections.Counter()
            for p, (a, b, n) in enumerate(s):
                inc = max(0, b - latest)
                latest = max(latest, b)
                step_add[n] += inc
                step_dur[n] += b - a
                per_pos[p][0].append(inc)
                per_pos[p][1].append(b - a)
                per_pos[p][2].append(a - s[p - 1][1] if p else 0)
            for n in step_add:
                add[n].append(step_add[n])
                dur[n].append(step_dur[n])
        print(f"{kind}: {len(idx)} steps of {common} kernels: span {median(spans) / 1e3:.1f} us, "
              f"gap to the next step {median(gaps) / 1e3:.1f} us")
        print("| kernel | launches a step | adds us a step | duration us a step |")
        print("|---|---|---|---|")
        counts = collections.Counter(k[2] for k in steps[idx[-1]])
        for n in sorted(add, key=lambda n: -median(add[n])):
            print(f"| {n} | {counts[n]} | {median(add[n]) / 1e3:.1f} | {median(dur[n]) / 1e3:.1f} |")
        s = steps[idx[-1]]
        layer_starts = [p for p, k in enumerate(s) if k[2].startswith("rmsnorm")][::2]
        if len(layer_starts) > 2:
            mid = len(layer_starts) // 2
            lo, hi = layer_starts[mid], layer_starts[mid + 1]
            print(f"one layer (kernels {lo}..{hi - 1}): adds / duration / gap after the previous end, us")
            for p in range(lo, hi):
                adds, durs, gaps_p = (median(v) / 1e3 for v in per_pos[p])
                print(f"  {s[p][2]:60s} {adds:6.2f} {durs:6.2f} {gaps_p:7.2f}")


if __name__ == "__main__":
    main()
