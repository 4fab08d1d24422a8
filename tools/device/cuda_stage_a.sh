#!/usr/bin/env bash
# Device call A of the full validation (then B and C within 30 s each, on the same warm machine):
# build, the CUDA kernel tests, the synthetic llama2-7b models written to /tmp/em in the
# background (cuda_perf.sh), and the first half of SmolLM2 stashed there (the model is larger
# than one call may carry). Carry: build/carry build/parts/smol.part00
cd "$(dirname "$0")/../.."
mkdir -p /tmp/em && cp build/parts/smol.part00 /tmp/em/
SKIP_DIAG=1 SKIP_NCU=1 TYPES=" " bash tools/device/cuda_perf.sh
