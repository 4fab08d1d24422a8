#!/usr/bin/env bash
# Where an engine decode step's time goes, on the synthetic llama2-7b Q4_0 (run after
# engine_setup.sh, e.g. as its EXTRA, or after run_prelude.sh): the loop's phases per step
# (engine_profile.py --wall) at each B of DIAG_B, every kernel of one B = DIAG_NCU_B step summed
# by name under Nsight Compute, then the stall reasons of that step's gemm_dq launches.
# Logs under $OUT (diag.log, ncu_engine_B.csv, ncu_dq.txt).
M=${MODEL:-/tmp/em/l7b-q4_0.gguf}
O=${OUT:-/tmp}
for B in ${DIAG_B:-1 8 64}; do
  timeout 120 python3 tools/device/engine_profile.py $M $B --wall 2>&1 | tee -a "$O/diag.log"
done
NCU_B=${DIAG_NCU_B:-8}
for B in $NCU_B; do
  timeout 200 ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum \
    python3 tools/device/engine_profile.py $M $B > "$O/ncu_engine_$B.csv" 2>&1
  python3 tools/device/summarize_ncu.py "$O/ncu_engine_$B.csv" 32 | head -16 | tee -a "$O/diag.log"
done
if [ "${DIAG_STALLS:-1}" = 1 ]; then
  timeout 200 ncu --profile-from-start off --clock-control none -k regex:gemm_dq_kernel --launch-count 4 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 tools/device/engine_profile.py $M ${NCU_B%% *} > "$O/ncu_dq.txt" 2>&1
  grep -E "gemm_dq_kernel|Duration|DRAM Throughput|Executed Ipc A|Eligible Warps|Grid Size|Cluster Size|Registers Per|issue_stalled" \
    "$O/ncu_dq.txt" | awk '$NF != "0" && $NF !~ /^0\.0/' | head -80 | tee -a "$O/diag.log"
fi
