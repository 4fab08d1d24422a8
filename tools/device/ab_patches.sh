#!/usr/bin/env bash
# Device call (after cuda_perf.sh has built build/dev and written /tmp/em): A/B of source variants.
# Each argument is a patch against the tree (git diff); for the baseline, then each patch, then
# the baseline again (drift check), it rebuilds _ember and runs bench_reps.py at each of $DEPTH
# (default 16384; a list such as "16384 0" runs them all on one build) on $MODEL (default the
# Q4_0 llama2-7b), after $CHECK (a command, e.g. a pytest subset) where given. Usage, carrying build/carry and build/ab:
#   EXTRA='bash tools/device/ab_patches.sh build/ab/*.patch' TYPES=Q4_0 SKIP_TESTS=1 SKIP_DIAG=1 \
#       SKIP_NCU=1 bash tools/device/cuda_perf.sh
cd "$(dirname "$0")/../.."
model=${MODEL:-/tmp/em/l7b-q4_0.gguf}
run() {
  ninja -C build/dev _ember > /tmp/ab_ninja.log 2>&1 || { grep -v '^\[' /tmp/ab_ninja.log | head -30; return 1; }
  [ -n "$CHECK" ] && echo "check: $(eval "$CHECK" 2>&1 | tail -1)"
  for d in ${DEPTH:-16384}; do
    timeout 120 python3 tools/device/bench_reps.py "$model" "$d" 128 "${REPS:-3}" "${KV:-f16}" 2>&1 | tail -1
  done
}
echo "baseline: $(run)"
for p in "$@"; do
  git apply "$p" || { echo "$p: does not apply"; continue; }
  echo "$(basename "$p"): $(run)"
  git apply -R "$p"
done
echo "baseline again: $(run)"
