#!/usr/bin/env bash
# Device call A: build, kernel tests, kernel benchmark; meanwhile write the synthetic llama2-7b
# (F16, vocab from build/carry/vocab.gguf) and its Q4_0 / Q8_0 / Q4_K_M quantizations to /tmp/em,
# and stash the first half of SmolLM2 there (the model is larger than one call may carry; call
# B brings the second half). Carry: build/carry build/parts/smol.part00. Every step has its own
# time limit and logs to $OUT/a.log, which comes back even when the call is cut off.
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/a.log"
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
mkdir -p /tmp/em && cp build/parts/smol.part00 /tmp/em/
step build
source tools/device/cuda_build.sh >> "$LOG" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG"; exit 1; }
step "build done, libstdc++ linked: $(ldd build/dev/_ember*.so | grep -c libstdc)"
if [ ! -f /tmp/em/l7b-q4_k_m.gguf ]; then
  ( timeout 200 python3 build/carry/make_synthetic_gguf.py --shape llama2-7b --vocab build/carry/vocab.gguf \
        -o /tmp/em/l7b-f16.gguf > /tmp/em/synth.log 2>&1
    for q in Q4_0 Q8_0 Q4_K_M; do
      timeout 150 python3 -m ember.quantize -q /tmp/em/l7b-f16.gguf /tmp/em/l7b-${q,,}.gguf $q >> /tmp/em/quant.log 2>&1
    done ) &
fi
step tests
timeout 200 python3 -m pytest tests/test_cuda.py -q -rs -s -k "not smollm" -p no:cacheprovider 2>&1 | grep -v "^seed" >> "$LOG"
step "tests rc=$?"
[ -z "$SKIP_BENCH" ] && timeout 120 build/dev/ember-cuda-bench > "${OUT:-/tmp}/bench_kernels.md" 2>&1
step "bench rc=$?"
wait; cat /tmp/em/quant.log | tail -3 >> "$LOG"
step "models: $(ls /tmp/em | tr '\n' ' ')"
grep -E "passed|failed|Error|error|FAIL|gpu vs cpu" "$LOG" | tail -24
cat "${OUT:-/tmp}/bench_kernels.md"
