#!/usr/bin/env bash
# Device call: build, kernel tests, synthetic llama2-7b models (F16 and Q4_0 / Q8_0 / Q4_K_M,
# kept in /tmp/em while the machine stays warm), a per-kernel time listing of one Q4_0 decode
# step under ncu, and ember-bench pp512/tg128 for each type. Carry: build/carry.
# Env: TYPES (default "Q4_0 Q8_0 Q4_K_M F16"), QUANTS (the quantized models written, default
# "Q4_0 Q8_0 Q4_K_M"), SKIP_TESTS=1, SKIP_DIAG=1, SKIP_NCU=1, NCU_TYPE (the type profiled, default
# Q4_0), EXTRA (a command run last).
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/perf.log"
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
mkdir -p /tmp/em
rm -f /tmp/em/built   # the quantizer below waits for this call's build, not a warm machine's last one
step "$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader); $(nproc) cpus; $(grep -m1 'model name' /proc/cpuinfo)"
quants=${QUANTS:-Q4_0 Q8_0 Q4_K_M}
missing=0
for q in F16 $quants; do [ -f /tmp/em/l7b-${q,,}.gguf ] || missing=1; done
if [ $missing = 1 ]; then
  ( python3 -m pip install -q --no-index --no-deps --target /tmp/site build/carry/wheels/*.whl
    [ -f /tmp/em/l7b-f16.gguf ] || PYTHONPATH=/tmp/site timeout 300 python3 build/carry/make_synthetic_gguf.py \
        --shape llama2-7b --vocab build/carry/vocab.gguf -o /tmp/em/l7b-f16.gguf > /tmp/em/synth.log 2>&1
    while [ ! -f /tmp/em/built ]; do sleep 2; done
    export PYTHONPATH=/tmp/site:$PWD/python EMBER_DEV_BUILD=$PWD/build/dev
    for q in $quants; do
      [ -f /tmp/em/l7b-${q,,}.gguf ] && continue
      timeout 200 python3 -m ember.quantize -q /tmp/em/l7b-f16.gguf /tmp/em/l7b-${q,,}.gguf.tmp $q >> /tmp/em/quant.log 2>&1 &&
        mv /tmp/em/l7b-${q,,}.gguf.tmp /tmp/em/l7b-${q,,}.gguf
    done ) &
fi
step build
source tools/device/cuda_build.sh >> "$LOG" 2>&1 || { echo "BUILD FAILED"; tail -40 "$LOG"; exit 1; }
touch /tmp/em/built
step "built"
if [ -z "$SKIP_TESTS" ]; then
  timeout 240 python3 -m pytest tests/test_cuda.py -q -rs -x -k "not smollm" -p no:cacheprovider > "${OUT:-/tmp}/tests.log" 2>&1
  step "tests rc=$? $(tail -1 "${OUT:-/tmp}/tests.log")"
fi
if [ -z "$SKIP_DIAG" ]; then   # GPU vs CPU logits on a synthetic SmolLM2-shaped model, per fusion/graph setting
  python3 build/carry/make_synthetic_gguf.py --shape smol-135m --vocab build/carry/vocab.gguf -o /tmp/em/smol-f16.gguf > /dev/null 2>&1
  python3 -m ember.quantize -q /tmp/em/smol-f16.gguf /tmp/em/smol-q4_1.gguf Q4_1
  for n in 5 20; do step "diag prompt $n"; timeout 120 python3 tools/device/cuda_diag.py /tmp/em/smol-q4_1.gguf $n 2>&1 | tee -a "$LOG"; done
fi
wait   # every model written: nothing else loads the host while benchmarks run
waitfor() { [ -f "$1" ]; }
bench() { timeout 150 python3 -m ember.bench --bandwidth 3000 "$@" 2>&1 | grep -v "^| model\|^|---"; }
for q in ${TYPES:-Q4_0 Q8_0 Q4_K_M F16}; do
  waitfor /tmp/em/l7b-${q,,}.gguf || { step "no model $q: $(tail -n 3 /tmp/em/synth.log /tmp/em/quant.log)"; continue; }
  if [ "$q" = "${NCU_TYPE:-Q4_0}" ] && [ -z "$SKIP_NCU" ]; then
    step "ncu $q"
    EMBER_CUDA_GRAPHS=0 timeout 200 ncu --metrics gpu__time_duration.sum --clock-control none --cache-control none --csv \
      --launch-skip 1200 --launch-count 500 python3 tools/device/cuda_profile.py /tmp/em/l7b-${q,,}.gguf 8 \
      > "${OUT:-/tmp}/ncu.csv" 2>"${OUT:-/tmp}/ncu.err"
    python3 tools/device/summarize_ncu.py "${OUT:-/tmp}/ncu.csv" 32 | tee -a "$LOG" | head -30
    timeout 100 python3 tools/device/cuda_profile.py /tmp/em/l7b-${q,,}.gguf 64 | tee -a "$LOG"
  fi
  bench -m /tmp/em/l7b-${q,,}.gguf -ngl -1 -p 512 -n 128 -r 3 | tee -a "$LOG"
done
[ -n "$EXTRA" ] && { step "extra: $EXTRA"; eval "$EXTRA" 2>&1 | tee -a "$LOG"; }
step done
grep -E "passed|failed|Error" "${OUT:-/tmp}/tests.log" | tail -5
