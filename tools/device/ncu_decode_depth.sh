#!/usr/bin/env bash
# Where a decode step's time goes at depth 16384 on the synthetic llama2-7b Q4_0 (f16 KV cache):
# the wall time per step (CUDA graphs on), then Nsight Compute's duration, DRAM bytes and DRAM
# throughput of one step's decode-attention launches.
# Run after cuda_perf.sh has built and written /tmp/em/l7b-q4_0.gguf (e.g. as its EXTRA); env
# DEPTH (default 16384). Reports go to $OUT/ncu_depth_*.csv.
M=/tmp/em/l7b-q4_0.gguf
D=${DEPTH:-16384}
python3 tools/device/cuda_profile.py $M 64 $D
EMBER_CUDA_GRAPHS=0 timeout 200 ncu --kernel-name regex:attention_decode --launch-skip 32 --launch-count 32 \
  --clock-control none --cache-control none --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  python3 tools/device/cuda_profile.py $M 3 $D > "${OUT:-/tmp}/ncu_depth_attn.csv" 2>&1
python3 - "${OUT:-/tmp}/ncu_depth_attn.csv" <<'PY'
import collections, csv, sys
vals = collections.defaultdict(list)
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    vals[(r["Kernel Name"].split("(")[0][:50], r["Metric Name"], r["Metric Unit"])].append(float(r["Metric Value"].replace(",", "")))
for (k, m, u), v in sorted(vals.items()):
    print(f"{k} {m}: mean {sum(v) / len(v):.4g} {u} over {len(v)}")
PY
