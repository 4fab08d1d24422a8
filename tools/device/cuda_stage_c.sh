#!/usr/bin/env bash
# Device call C (after A and B): every row of the issue's speed table on the synthetic
# llama2-7b models A wrote: pp512 / tg128 per type, tg128 after depth 16384, and 16 of 32 blocks
# on the GPU (pp512 / tg64, and tg64 with the CPU weights in huge pages, -mmp 0); depth 16384
# with the f16 and the q8_0 KV cache. Carry: build/carry
cd "$(dirname "$0")/../.."
SKIP_TESTS=1 SKIP_DIAG=1 SKIP_NCU=1 EXTRA='bench -m /tmp/em/l7b-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -r 2;
  bench -m /tmp/em/l7b-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -ctk q8_0 -ctv q8_0 -r 2;
  bench -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 512 -n 64 -r 3;
  bench -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 0 -n 64 -r 3 -mmp 0' bash tools/device/cuda_perf.sh
