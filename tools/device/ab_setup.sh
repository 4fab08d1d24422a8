#!/usr/bin/env bash
# Device call 1 of a before/after comparison: builds this tree (build/dev) and a baseline tree
# (build/base_src, e.g. `git archive BASE | tar -x -C build/base_src`, built in /tmp/base, outside
# the carried paths that the next call's tree replaces) side by side, writes the
# synthetic llama2-7b F16 and its Q4_0 / Q8_0 / Q4_K_M quantizations to /tmp/em, stores any
# model parts carried in build/parts under /tmp/em/parts, then runs the CUDA kernel tests.
# Carry: build/carry build/base_src [build/parts/...]. Env: QUANTS, PYTEST_K (default "not smollm").
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/setup.log"
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
mkdir -p /tmp/em/parts
cp build/parts/* /tmp/em/parts/ 2>/dev/null
step "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); $(nproc) cpus"
python3 -m pip install -q --no-index --no-deps --target /tmp/site build/carry/wheels/*.whl
[ -f /tmp/em/l7b-f16.gguf ] || ( PYTHONPATH=/tmp/site timeout 400 python3 build/carry/make_synthetic_gguf.py \
    --shape llama2-7b --vocab build/carry/vocab.gguf -o /tmp/em/l7b-f16.gguf > /tmp/em/synth.log 2>&1 ) &
synth=$!
rm -rf /tmp/base && cp -r build/base_src /tmp/base && mkdir -p /tmp/base/build && cp -r build/carry /tmp/base/build/carry
( sleep 15; source /tmp/base/tools/device/cuda_build.sh > /tmp/em/base_build.log 2>&1 && echo ok > /tmp/em/base_built ) &
base=$!
step "build"
source tools/device/cuda_build.sh >> "$LOG" 2>&1 || { echo "BUILD FAILED"; tail -60 "$LOG"; exit 1; }
step "built"
wait $base; step "baseline build: $(cat /tmp/em/base_built 2>/dev/null || tail -20 /tmp/em/base_build.log)"
wait $synth; step "synthetic f16: $(ls -la /tmp/em/l7b-f16.gguf 2>&1 | awk '{print $5}')"
for q in ${QUANTS:-Q4_0 Q8_0 Q4_K_M}; do
  [ -f /tmp/em/l7b-${q,,}.gguf ] && continue
  timeout 200 python3 -m ember.quantize -q /tmp/em/l7b-f16.gguf /tmp/em/l7b-${q,,}.gguf.tmp $q >> /tmp/em/quant.log 2>&1 &&
    mv /tmp/em/l7b-${q,,}.gguf.tmp /tmp/em/l7b-${q,,}.gguf
done
step "models: $(ls /tmp/em)"
timeout 240 python3 -m pytest tests/test_cuda.py -q -rs -k "${PYTEST_K:-not smollm}" -p no:cacheprovider > "${OUT:-/tmp}/tests.log" 2>&1
step "tests rc=$? $(tail -1 "${OUT:-/tmp}/tests.log")"
