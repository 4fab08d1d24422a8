#!/usr/bin/env bash
# The engine's one-sequence decode step against a Context's under backend switches (run as
# engine_setup.sh's EXTRA with LCPP=0): engine_profile.py MODEL 1 --wall under each setting of
# $ENVS (';'-separated; an empty item is the default), $REPS times each, interleaved: what each
# switch costs or saves the two paths, measured side by side. BASE=1 adds the baseline tree that
# engine_setup.sh built from build/base_src (/tmp/base) as one more setting.
M=${MODEL:-/tmp/em/l7b-q4_0.gguf}
L="${OUT:-/tmp}/b1_env.log"
IFS=';' read -r -a settings <<< "${ENVS-;EMBER_CUDA_PDL=0;EMBER_CUDA_GRAPHS=0}"
[ ${#settings[@]} = 0 ] && settings=("")   # ENVS='': the default alone
[ "${BASE:-0}" = 1 ] && settings+=("EMBER_DEV_BUILD=/tmp/base/build/dev PYTHONPATH=/tmp/site:/tmp/base/python:/tmp/base/tests")
for rep in $(seq "${REPS:-2}"); do
  for s in "${settings[@]}"; do
    echo "== [${s:-default}] $(env $s timeout 120 python3 tools/device/engine_profile.py "$M" 1 --wall 2>&1 | tr '\n' ' ')" | tee -a "$L"
  done
done
