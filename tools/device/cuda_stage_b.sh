#!/usr/bin/env bash
# Device call B (right after A, same warm machine): reassemble SmolLM2 in /tmp/em, run the
# end-to-end GPU tests (greedy vs llama.cpp, perplexity, logits vs CPU), then ember-bench on the
# synthetic llama2-7b models A wrote. Carry: build/carry build/parts/smol.part01
set -o pipefail
cd "$(dirname "$0")/../.."
cat /tmp/em/smol.part00 build/parts/smol.part01 > /tmp/em/SmolLM2-135M-Instruct.Q4_1.gguf
export EMBER_TEST_CACHE=/tmp/em
source tools/device/cuda_build.sh || { echo "BUILD FAILED"; exit 1; }
python3 -m pytest tests/test_cuda.py -q -rs -s -k smollm 2>&1 | tee "$OUT/e2e.log" |
  grep -E "match|PPL|passed|failed|Error|assert|Segm|Fatal" | tail -40
bench() { python3 -m ember.bench --bandwidth 4300 "$@" 2>&1 | grep -v "^| model\|^|---"; }
{
  for q in ${BENCH_TYPES:-Q4_0 Q8_0 Q4_K_M F16}; do bench -m /tmp/em/l7b-${q,,}.gguf -ngl -1 -p 512 -n 128 -r 3; done
  [ -n "$BENCH_DEPTH" ] && bench -m /tmp/em/l7b-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -r 2
  [ -n "$BENCH_PARTIAL" ] && bench -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 512 -n 64 -r 2
} | tee "$OUT/bench_model.md"
