#!/usr/bin/env bash
# Device machine, one call: build, CUDA kernel tests vs references, kernel benchmark table.
# Usage (from the repo root, via the device tool): bash tools/device/cuda_check.sh
set -o pipefail
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
source tools/device/cuda_build.sh || { echo "BUILD FAILED"; exit 1; }
python3 -m pytest tests/test_cuda.py -q -rs -k "not smollm" 2>&1 | tee "${OUT:-/tmp}/test_cuda.log" | tail -40
build/dev/ember-cuda-bench 2>&1 | tee "${OUT:-/tmp}/bench_kernels.md"
