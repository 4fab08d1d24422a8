#!/usr/bin/env bash
# Where the engine's one-sequence decode step loses time against a Context's, on the synthetic
# llama2-7b Q4_0 (run as engine_setup.sh's EXTRA with LCPP=0, or after run_prelude.sh): both
# timed (engine_profile.py 1 --wall), then one step of each inside a profiler range: under nsys
# where the machine has it (kernels with their start times, so the gaps show, and the CUDA API
# calls), else under ncu (kernel durations only). Logs under $OUT (b1.log and the reports).
M=${MODEL:-/tmp/em/l7b-q4_0.gguf}
O=${OUT:-/tmp}
L="$O/b1.log"
for i in 1 2; do timeout 120 python3 tools/device/engine_profile.py $M 1 --wall 2>&1 | tee -a "$L"; done
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
for mode in engine context; do
  args="$M 1"; [ $mode = context ] && args="$M 1 --context"
  if [ -n "$NSYS" ]; then
    timeout 200 "$NSYS" profile -t cuda --capture-range=cudaProfilerApi --capture-range-end=stop -f true \
      -o "$O/$mode" python3 tools/device/engine_profile.py $args > "$O/nsys_$mode.txt" 2>&1
    "$NSYS" stats -q -f csv -r cuda_gpu_trace -o "$O/${mode}" "$O/$mode.nsys-rep" >> "$O/nsys_$mode.txt" 2>&1
    "$NSYS" stats -q -r cuda_api_sum "$O/$mode.nsys-rep" 2>&1 | head -30 | tee -a "$L"
    python3 tools/device/gpu_trace_gaps.py "$O/${mode}_cuda_gpu_trace.csv" "$mode" 2>&1 | tee -a "$L"
  else
    echo "no nsys: ncu" | tee -a "$L"
    timeout 200 ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum \
      python3 tools/device/engine_profile.py $args > "$O/ncu_$mode.csv" 2>&1
    python3 tools/device/summarize_ncu.py "$O/ncu_$mode.csv" 32 | head -24 | tee -a "$L"
  fi
done
