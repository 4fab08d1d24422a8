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
for q in ${BENCH_TYPES:-Q4_0 Q8_0 Q4_K_M F16}; do
  python3 -m ember.bench -m /tmp/em/l7b-${q,,}.gguf -ngl -1 -p 512 -n 128 -r 3 --bandwidth 4300 2>&1 | tail -2
done | tee "$OUT/bench_model.md"
