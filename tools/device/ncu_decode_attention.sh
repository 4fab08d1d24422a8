for kv in q8_0 f16; do
  EMBER_CUDA_GRAPHS=0 timeout 150 ncu --kernel-name regex:attention_decode --launch-skip 64 --launch-count 1 \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
    python3 tools/device/cuda_profile.py /tmp/em/l7b-q4_0.gguf 4 8192 $kv > $OUT/ncu_$kv.txt 2>&1
  grep -E "Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Issued Warp|Eligible|No Eligible|Shared Memory Configuration|Dynamic Shared" $OUT/ncu_$kv.txt | head -40
done
