#!/usr/bin/env bash
# Device call: A/B of the CPU decode matmul's hand-out size (EMBER_CPU_HANDOUT_KB, the k of
# CpuBackend::row_grain; 0 = the count-only rule) on the synthetic llama2-7b Q4_0 with 16
# threads, -ngl 16 and CPU only, one context per setting with steps interleaved
# (tools/device/cpu_decode_ab.py). Carry: build/carry.
cd "$(dirname "$0")/../.."
TYPES="Q4_0" SKIP_TESTS=1 SKIP_DIAG=1 SKIP_NCU=1 EXTRA='
  python3 tools/device/cpu_decode_ab.py /tmp/em/l7b-q4_0.gguf 16 16 EMBER_CPU_HANDOUT_KB 0 16 64 256;
  python3 tools/device/cpu_decode_ab.py /tmp/em/l7b-q4_0.gguf 0 16 EMBER_CPU_HANDOUT_KB 0 16 64 256' \
  bash tools/device/cuda_perf.sh
