#!/usr/bin/env bash
# Device check of the attention kernels: the CUDA attention tests (tests/test_cuda.py -k attention,
# the reference-order kernel's bits against the CPU among them), then ember-cuda-bench's attention
# table (one decode token at depths 128-16384, a 512-token prompt) for this tree, for this tree
# with EMBER_CUDA_EXACT_CLUSTER=0 (the one-CTA-a-head form), and for the baseline tree where
# base_build.sh built one. Run alone or as engine_setup.sh's EXTRA (the build is then up to date).
# Logs under $OUT (attn_tests.log, attn_bench.log).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp}
source tools/device/cuda_build.sh || { echo "build failed"; exit 1; }
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest tests/test_cuda.py -q -rs -k "${PYTEST_K:-attention}" -p no:cacheprovider \
    > "$OUT/attn_tests.log" 2>&1
echo "attention tests rc=$? $(tail -1 "$OUT/attn_tests.log")"
grep -E "^(FAILED|ERROR)|Error|mismatch" "$OUT/attn_tests.log" | head -20
{
  echo "## this tree"; build/dev/ember-cuda-bench attention | grep "^| "
  echo "## EMBER_CUDA_EXACT_CLUSTER=0"; EMBER_CUDA_EXACT_CLUSTER=0 build/dev/ember-cuda-bench attention | grep "^| "
  if [ -f /tmp/base_built ]; then echo "## baseline"; /tmp/base/build/dev/ember-cuda-bench attention | grep "^| "; fi
  echo "## this tree again"; build/dev/ember-cuda-bench attention | grep "^| "
} 2>&1 | tee "$OUT/attn_bench.log"
