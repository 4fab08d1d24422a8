#!/usr/bin/env bash
# Device call 2 of the engine runs (after engine_setup.sh on the same warm machine): the CUDA
# engine tests on SmolLM2 (its second part carried now), then llama-batched-bench and
# ember-bench -npl on the synthetic llama2-7b Q4_0, one after the other in this call.
# Carry: build/carry, and the SmolLM2 parts for the tests (both by now: the file is put together
# once both have come). Env: NPL (default 1,8,32,64,128), TESTS=0 skips tests,
# DETERMINISTIC=B,... adds a deterministic-mode row set, BASELINE_ENV="VAR=value ..." a second
# ember-bench -npl under those variables (an A/B in the same call), BASE=1 the baseline tree's
# ember-bench -npl (built by engine_setup.sh from build/base_src) and this tree's again, TG=0
# skips the one-sequence run, EXTRA: a command run at the end.
cd "$(dirname "$0")/../.."
source tools/device/run_prelude.sh
NPL=${NPL:-1,8,32,64,128}
M=/tmp/em/l7b-q4_0.gguf
# ember-bench -npl on the synthetic model; "$@": variables for it (env NAME=value ...).
ember_npl() { env "$@" timeout 240 python3 -m ember.bench -m $M -ngl -1 -npl $NPL -npp 128 -ntg 128 2>&1 | tee -a "$LOG"; }
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest tests/test_engine.py tests/test_cuda_gemm.py -q -rs -k "cuda or gemm" -p no:cacheprovider \
      > "${OUT:-/tmp}/tests.log" 2>&1
  step "tests rc=$? $(tail -1 "${OUT:-/tmp}/tests.log")"
fi
step "llama-batched-bench"
timeout 200 /tmp/lcpp/llama.cpp/build/bin/llama-batched-bench -m $M -ngl 99 -npp 128 -ntg 128 -npl $NPL -c 33000 \
    -b 2048 -ub 512 2>&1 | grep -E "^\|" | tee -a "$LOG"
step "ember-bench -npl"
ember_npl
if [ "${BASE:-0}" = 1 ] && [ -f /tmp/base_built ]; then
  step "ember-bench -npl, the baseline tree (/tmp/base)"
  ember_npl PYTHONPATH=/tmp/site:/tmp/base/python EMBER_DEV_BUILD=/tmp/base/build/dev
  step "ember-bench -npl, this tree again"
  ember_npl
fi
if [ -n "$BASELINE_ENV" ]; then
  step "ember-bench -npl with $BASELINE_ENV"
  ember_npl $BASELINE_ENV
fi
if [ -n "$DETERMINISTIC" ]; then
  step "ember-bench -npl --deterministic"
  timeout 200 python3 -m ember.bench -m $M -ngl -1 -npl $DETERMINISTIC -npp 128 -ntg 128 --deterministic 2>&1 | tee -a "$LOG"
fi
if [ "${TG:-1}" = 1 ]; then
  step "ember-bench tg128 (one sequence, Context)"
  timeout 120 python3 -m ember.bench -m $M -ngl -1 -p 0 -n 128 -r 2 2>&1 | tee -a "$LOG"
fi
[ -n "$EXTRA" ] && { step "extra: $EXTRA"; eval "$EXTRA"; }
step "done"
