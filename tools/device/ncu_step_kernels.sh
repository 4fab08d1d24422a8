#!/usr/bin/env bash
# Every kernel of one decode step of the synthetic llama2-7b Q4_0 (f16 KV) under Nsight Compute,
# summed by kernel name (serialized by the profiler, so each is its time alone), at depth 0 and at
# DEPTHS (default "16384"); then the wall time per step with CUDA graphs, to set against the sum.
# Run after cuda_perf.sh has built and written /tmp/em/l7b-q4_0.gguf (e.g. as its EXTRA).
M=${MODEL:-/tmp/em/l7b-q4_0.gguf}
for D in 4 ${DEPTHS:-16384}; do
  echo "-- depth $D"
  EMBER_CUDA_GRAPHS=0 timeout 300 ncu --profile-from-start off --clock-control none --cache-control none --csv \
    --metrics gpu__time_duration.sum python3 tools/device/cuda_profile.py $M 1 $D > "${OUT:-/tmp}/ncu_step_$D.csv" 2>&1
  python3 tools/device/summarize_ncu.py "${OUT:-/tmp}/ncu_step_$D.csv" 32
  python3 tools/device/cuda_profile.py $M 64 $D
done
