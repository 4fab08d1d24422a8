#!/usr/bin/env bash
# Device call for the dequantizing f16 GEMM (cuda/gemm_dq.cu): build, its tests (tests/test_cuda_gemm.py)
# and the matmul tests of tests/test_cuda.py, then ember-cuda-bench's batched-decode table (the
# dispatch of project(), and with EMBER_CUDA_GEMM_DQ=0 the older paths: gemm_q8, cuBLAS) and its
# gemm_dq table (the kernel launched directly, every format and batch size). Carry: build/carry.
# Logs under $OUT (dq_tests.log, dq_bench.log). PYTEST_K selects tests (default: all but smollm);
# TESTS=0 skips them. ROWS="192 256" adds the gemm_dq table with each wgmma row tile forced.
# NCU=1: also Nsight Compute sections and stall reasons of gemm_dq launches (ncu_*.txt; NCU_FORMS
# below). A baseline tree in build/base_src (`git archive BASE | tar -x -C build/base_src`, carried
# too) is built beside this one in /tmp/base, and its gemm_dq table runs before and after this
# tree's (dq_base.log), so the comparison is within one call.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gemm_dq_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. tools/device/base_build.sh
. tools/device/cuda_build.sh || { echo "build failed"; exit 1; }
set -o pipefail
tests_rc=0
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest tests/test_cuda_gemm.py tests/test_cuda.py -q -x -rs \
    -k "${PYTEST_K:-not smollm}" -p no:cacheprovider 2>&1 | tee "$OUT/dq_tests.log" | tail -6
  tests_rc=$?
fi
base_table() { [ -f /tmp/base_built ] && { echo "## baseline ($1)"; /tmp/base/build/dev/ember-cuda-bench gemm_dq | grep "^| "; } }
base_wait
base_table before 2>&1 | tee "$OUT/dq_base.log"
{
  build/dev/ember-cuda-bench gemm
  echo "## EMBER_CUDA_GEMM_DQ=0"; EMBER_CUDA_GEMM_DQ=0 build/dev/ember-cuda-bench gemm | grep "^| "
  echo "## gemm_dq (the default form)"; build/dev/ember-cuda-bench gemm_dq | grep "^| "
  echo "## EMBER_CUDA_GEMM_DQ_WGMMA=0 (the mma.sync form)"; EMBER_CUDA_GEMM_DQ_WGMMA=0 build/dev/ember-cuda-bench gemm_dq | grep "^| "
  for rows in ${ROWS:-}; do   # ROWS="192 256": the wgmma form's row tile forced
    echo "## EMBER_CUDA_GEMM_DQ_ROWS=$rows"; EMBER_CUDA_GEMM_DQ_ROWS=$rows build/dev/ember-cuda-bench gemm_dq | grep "^| "
  done
} 2>&1 | tee "$OUT/dq_bench.log"
base_table after 2>&1 | tee -a "$OUT/dq_base.log"
if [ "${NCU:-0}" = 1 ]; then
  # The gemm_dq table launches each configuration 2 * 141 times (with and without the conversion
  # of x): launch 282 * c + 150 is one of the c-th configuration's kernel-only runs (0-8: Q4_0
  # 4096x4096 at 9, 16, 32, 48, 64, 96, 128, 192, 256 tokens; 9-17: 11008x4096). NCU_FORMS picks
  # the kernels: cur (this tree's default), mma (this tree's mma.sync form), base (the baseline's).
  for c in ${NCU_CONFIGS:-1 4}; do
    for form in ${NCU_FORMS:-cur}; do
      case $form in
        cur) bench=(build/dev/ember-cuda-bench) ;;
        mma) bench=(env EMBER_CUDA_GEMM_DQ_WGMMA=0 build/dev/ember-cuda-bench) ;;
        base) [ -f /tmp/base_built ] || continue; bench=(/tmp/base/build/dev/ember-cuda-bench) ;;
      esac
      echo "## ncu config $c, $form"
      timeout 120 ncu --clock-control none -k regex:gemm_dq_kernel --launch-skip $((282 * c + 150)) --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__inst_executed_op_ldsm.sum,smsp__inst_executed_op_shared_ld.sum" \
        "${bench[@]}" gemm_dq > "$OUT/ncu_${c}_$form.txt" 2>&1
      grep -E "Duration|DRAM Throughput|Elapsed Cycles|SM Active|Executed Ipc A|Eligible Warps|Grid Size|Cluster Size|Registers Per|issue_stalled|hmma|inst_executed" \
        "$OUT/ncu_${c}_$form.txt" | awk '$NF != "0" && $NF !~ /^0\.0/' | head -40
    done
  done
fi
exit $tests_rc
