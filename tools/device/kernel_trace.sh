#!/usr/bin/env bash
# Kernel timeline of a command on the device (no nsys there): builds kernel_trace.c against the
# machine's CUPTI, runs "$@" with it injected, and prints kernel_timeline.py's summary. Trace and
# summary under $OUT. Usage (after `ember_device.sh build models --`, which puts the build and models in place):
#   bash tools/device/kernel_trace.sh python3 tools/device/engine_profile.py /tmp/em/l7b-q4_0.gguf 1 --wall
cd "$(dirname "$0")/../.."
O=${OUT:-/tmp}
CUDA=${CUDA_HOME:-/usr/local/cuda}
lib=$(ls "$CUDA"/lib64/libcupti.so "$CUDA"/extras/CUPTI/lib64/libcupti.so "$CUDA"/targets/*/lib/libcupti.so 2>/dev/null | head -1)
inc=$(dirname "$(ls "$CUDA"/include/cupti.h "$CUDA"/extras/CUPTI/include/cupti.h "$CUDA"/targets/*/include/cupti.h 2>/dev/null | head -1)")
cc -O2 -shared -fPIC tools/device/kernel_trace.c -o /tmp/libkernel_trace.so -I"$inc" -I"$CUDA/include" \
   -L"$(dirname "$lib")" -Wl,-rpath,"$(dirname "$lib")" -lcupti || { echo "kernel_trace: build failed ($lib)"; exit 1; }
CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT="$O/kernel_trace.csv" "$@"
python3 tools/device/kernel_timeline.py "$O/kernel_trace.csv" "${STEPS:-16}" | tee "$O/kernel_timeline.txt"
gzip -f "$O/kernel_trace.csv"
