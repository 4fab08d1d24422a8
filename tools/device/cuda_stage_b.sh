#!/usr/bin/env bash
# Device call B (right after A): reassemble SmolLM2 in /tmp/em and run the whole test suite on
# the H100 (the CPU tests, the CUDA kernel tests, SmolLM2 on the GPU all-in and split against
# llama.cpp's reference; PYTEST_ARGS narrows it). Carry: build/carry build/parts/smol.part01
set -o pipefail
cd "$(dirname "$0")/../.."
cat /tmp/em/smol.part00 build/parts/smol.part01 > /tmp/em/SmolLM2-135M-Instruct.Q4_1.gguf
export EMBER_TEST_CACHE=/tmp/em
source tools/device/cuda_build.sh || { echo "BUILD FAILED"; exit 1; }
timeout 540 python3 -m pytest ${PYTEST_ARGS:-tests} -q -rs -s -p no:cacheprovider 2>&1 | tee "$OUT/suite.log" |
  grep -E "tokens match|PPL|perplexity|passed|failed|FAILED|Error|xfail|XPASS" | tail -40
