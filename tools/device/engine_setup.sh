#!/usr/bin/env bash
# Device call 1 of the engine runs: builds llama.cpp's llama-batched-bench (build/lcpp/lcpp.tar.xz,
# packed by llamacpp_on_gpu.sh pack) and this tree (build/dev) side by side, writes the synthetic
# llama2-7b Q4_0 to /tmp/em, and stores the first part of the SmolLM2 file (build/parts).
# Carry: build/carry build/lcpp build/parts/smol.partaa. The next call (engine_bench.sh) runs.
# Env: LCPP=0 skips llama.cpp; LCPP_TARGETS: its targets (default llama-batched-bench); EXTRA: a
# command run at the end (e.g. a profile). A baseline tree in build/base_src (carried) is built
# beside this one (base_build.sh) for engine_bench.sh's BASE=1.
cd "$(dirname "$0")/../.."
LOG="${OUT:-/tmp}/setup.log"
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
mkdir -p /tmp/em/parts && cp build/parts/* /tmp/em/parts/ 2>/dev/null
step "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader); $(nproc) cpus"
[ "${LCPP:-1}" = 1 ] && ( bash tools/device/llamacpp_build.sh build/lcpp/lcpp.tar.xz "${LCPP_TARGETS:-llama-batched-bench}" > /tmp/em/lcpp.log 2>&1; echo "rc=$?" >> /tmp/em/lcpp.log ) &
lcpp=$!
python3 -m pip install -q --no-index --no-deps --target /tmp/site build/carry/wheels/*.whl
[ -f /tmp/em/l7b-q4_0.gguf ] || ( PYTHONPATH=/tmp/site timeout 400 python3 build/carry/make_synthetic_gguf.py \
    --shape llama2-7b --vocab build/carry/vocab.gguf -o /tmp/em/l7b-f16.gguf > /tmp/em/synth.log 2>&1 ) &
synth=$!
. tools/device/base_build.sh
step "build"
source tools/device/cuda_build.sh >> "$LOG" 2>&1 || { echo "BUILD FAILED"; tail -60 "$LOG"; exit 1; }
step "built"
[ -n "$base_pid" ] && { base_wait; step "baseline build: $(cat /tmp/base_built 2>/dev/null)"; }
wait $synth; step "synthetic f16: $(ls -la /tmp/em/l7b-f16.gguf 2>&1 | awk '{print $5}')"
[ -f /tmp/em/l7b-q4_0.gguf ] || { timeout 200 python3 -m ember.quantize /tmp/em/l7b-f16.gguf /tmp/em/l7b-q4_0.gguf.tmp Q4_0 \
    >> /tmp/em/quant.log 2>&1 && mv /tmp/em/l7b-q4_0.gguf.tmp /tmp/em/l7b-q4_0.gguf && rm -f /tmp/em/l7b-f16.gguf; }
step "models: $(ls /tmp/em)"
if [ "${LCPP:-1}" = 1 ]; then wait $lcpp; step "llama.cpp: $(tail -2 /tmp/em/lcpp.log | tr '\n' ' ')"; fi
# (EXTRA is unset before it runs: engine_bench.sh, a usual EXTRA, runs its own EXTRA too)
[ -n "$EXTRA" ] && { step "extra: $EXTRA"; extra=$EXTRA; unset EXTRA; eval "$extra"; }
