#!/usr/bin/env bash
# Device call: where -ngl 16 decode spends its time on the host CPU, and the F16 decode step per
# kernel. Host facts (topology, huge pages), Q4_0 matmul rate by threads from memory and from
# cache, -ngl 16 tg64 by thread count and SIMD level, then ncu of one F16 step and the GEMV table.
# Carry: build/carry.
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/diag.log"
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA|L3|Flags" | sed 's/Flags:.*\(avx512_vnni\|amx_int8\).*/Flags: (has \1 ...)/' | tee "$LOG"
grep -o 'amx[a-z0-9_]*\|avx512_vnni\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' | tee -a "$LOG"; echo
cat /sys/kernel/mm/transparent_hugepage/enabled | tee -a "$LOG"
SKIP_TESTS=1 SKIP_DIAG=1 NCU_TYPE=F16 TYPES="F16 Q4_0" EXTRA='
  python3 tools/device/cpu_threads.py 8 anon 1 4 8 16; python3 tools/device/cpu_threads.py 8 file 1 4 8 16;
  python3 tools/device/cpu_threads.py 1 anon 1 4 8 16;
  for t in 8 16; do bench -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 0 -n 64 -r 2 -t $t; done;
  EMBER_SIMD=avx2 bench -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 0 -n 64 -r 2 -t 16;
  bench -m /tmp/em/l7b-q4_0.gguf -ngl 0 -p 0 -n 16 -r 1 -t 16;
  ./build/dev/ember-cuda-bench gemv 2>&1 | grep -E "type|F16|Q4_0"' bash tools/device/cuda_perf.sh
