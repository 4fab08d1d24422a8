#!/usr/bin/env bash
# Device call for the quantized GEMM (cuda/gemm_q8.cu): build, its tests and the CUDA kernel tests,
# then the Q4_0 batched-decode table of ember-cuda-bench with gemm_q8 and with the older paths
# (EMBER_CUDA_GEMM_Q8=0). Carry: build/carry. Logs under $OUT (gemm_tests.log, gemm_bench.log).
# NCU=1: also Nsight Compute sections of single gemm_q8 launches of the table (ncu_*.txt).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_q8_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. tools/device/cuda_build.sh || { echo "build failed"; exit 1; }
set -o pipefail
timeout 240 python3 -m pytest tests/test_cuda_gemm.py tests/test_cuda.py -q -x -rs -k "${PYTEST_K:-not smollm}" \
  -p no:cacheprovider 2>&1 | tee "$OUT/gemm_tests.log" | tail -4
tests_rc=$?
{
  build/dev/ember-cuda-bench gemm
  for env in EMBER_CUDA_GEMM_Q8=0 ${BENCH_ENVS:-}; do
    echo "## $env"; env "$env" build/dev/ember-cuda-bench gemm | grep "^| "
  done
} 2>&1 | tee "$OUT/gemm_bench.log"
if [ "${NCU:-0}" = 1 ]; then
  # time_it runs a configuration 141 times: gemm_q8 launch 141 * c + 10 is one of the c-th
  # configuration that takes gemm_q8 (0-2: 4096x4096 at 16, 32, 64 tokens; 3-5: 11008x4096).
  for c in ${NCU_CONFIGS:-2 5}; do
    timeout 120 ncu --clock-control none -k regex:gemm_q8 --launch-skip $((141 * c + 10)) --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      build/dev/ember-cuda-bench gemm > "$OUT/ncu_$c.txt" 2>&1
    grep -E "gemm_q8_kernel|Duration|Throughput|Issue Slots|Eligible|Active Warps|Theoretical Occ|Achieved Occ|Cluster|Registers|Stall|Executed Ipc|Pipe" "$OUT/ncu_$c.txt" | head -45
  done
  # The SASS of the Q4_0 kernel for 33-64 tokens and its opcode histogram.
  cuobjdump -sass build/dev/cuda/CMakeFiles/ember_cuda.dir/gemm_q8.cu.o |
    awk '/Function : /{f = /GemmQ4_0ELi4ELi2E/} f' > "$OUT/sass_q4_0_64.txt"
  grep -E '/\*[0-9a-f]{4}\*/' "$OUT/sass_q4_0_64.txt" | sed -E 's/.*\*\/ +(@!?U?P[T0-9]+ +)?([A-Z0-9_]+).*/\2/' |
    sort | uniq -c | sort -rn | head -25 | tr '\n' ' '; echo
fi
exit $tests_rc
