#!/usr/bin/env bash
# Nsight Compute sections (launch, occupancy, warp states, speed of light) of one decode-attention
# launch at depth 8192 on the synthetic llama2-7b Q4_0, for the q8_0 and the f16 KV cache.
# Run after cuda_perf.sh has built and written /tmp/em/l7b-q4_0.gguf (e.g. as its EXTRA);
# full reports go to $OUT/ncu_<type>.txt.
for kv in q8_0 f16; do
  EMBER_CUDA_GRAPHS=0 timeout 150 ncu --kernel-name regex:attention_decode --launch-skip 64 --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
    python3 tools/device/cuda_profile.py /tmp/em/l7b-q4_0.gguf 4 8192 $kv > "${OUT:-/tmp}/ncu_$kv.txt" 2>&1
  echo "== $kv"
  grep -E "Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|DRAM Throughput|Issued Warp|Eligible Warps|Dynamic Shared" \
    "${OUT:-/tmp}/ncu_$kv.txt" | head -40
done
