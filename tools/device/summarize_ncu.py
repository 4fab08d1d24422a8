#!/usr/bin/env python3
"""Sum an ncu --csv gpu__time_duration listing by kernel name: where one decode step's time goes.

    summarize_ncu.py NCU.csv [N_LAYERS]
"""
import collections
import csv
import sys


def main():
    rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    n_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in rows:
        name = r["Kernel Name"].split("(")[0][:60]
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r["Metric Unit"]]
        total[name] += float(r["Metric Value"].replace(",", "")) * scale
        count[name] += 1
    all_us = sum(total.values())
    print(f"{len(rows)} kernels, {all_us:.1f} us in all ({all_us / max(1, len(rows)):.2f} us each)")
    print("| kernel | launches | total us | us each | per layer us |")
    print("|---|---|---|---|---|")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {count[name]} | {us:.1f} | {us / count[name]:.2f} | {us / n_layer:.2f} |")


if __name__ == "__main__":
    main()
