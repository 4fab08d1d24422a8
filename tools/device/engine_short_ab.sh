#!/usr/bin/env bash
# attention_short's settings side by side (run as engine_setup.sh's EXTRA, LCPP=0 allowed): its
# kernel tests, then ember-bench -npl on the synthetic llama2-7b Q4_0 under each variant in VARIANTS
# (";"-separated variable sets, "-" for the defaults), ROUNDS times interleaved, then
# engine_b1_diag.sh (the engine's B = 1 step against a Context's) unless B1_DIAG=0.
# Logs under $OUT (bench.log, short_tests.log, b1.log).
cd "$(dirname "$0")/../.."
source tools/device/run_prelude.sh
M=/tmp/em/l7b-q4_0.gguf
timeout 120 python3 -m pytest tests/test_cuda.py -q -rs -k "short" -p no:cacheprovider > "${OUT:-/tmp}/short_tests.log" 2>&1
step "short tests rc=$? $(tail -1 "${OUT:-/tmp}/short_tests.log")"
IFS=';' read -ra variants <<< "${VARIANTS:--;EMBER_CUDA_SHORT_ATTN=1}"
for round in $(seq "${ROUNDS:-2}"); do
  for v in "${variants[@]}"; do
    step "round $round: ember-bench -npl ${NPL:-1,8,32,64} with ${v}"
    [ "$v" = - ] && v=
    env $v timeout 120 python3 -m ember.bench -m $M -ngl -1 -npl "${NPL:-1,8,32,64}" -npp 128 -ntg 128 2>&1 |
      grep -E "^\| +128" | tee -a "$LOG"
  done
done
[ "${B1_DIAG:-1}" = 1 ] && timeout 300 bash tools/device/engine_b1_diag.sh
step "done"
