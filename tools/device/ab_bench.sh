#!/usr/bin/env bash
# Device call after ab_setup.sh: rows of the H100 speed table (docs/performance.md) for this
# tree and the baseline tree (built in /tmp/base), alternating baseline / this tree per row, on the models in /tmp/em.
# ROWS picks rows by name (default all): q4_0 q8_0 q4_k_m f16 depth depth_q8 ngl16 ngl16_mmp0.
# Any model parts carried in build/parts are stored under /tmp/em/parts.
cd "$(dirname "$0")/../.."
mkdir -p /tmp/em/parts
cp build/parts/* /tmp/em/parts/ 2>/dev/null
export PYTHONUNBUFFERED=1
bench() {   # bench TREE ARGS...: ember-bench of the tree's build, its result lines only
  local tree=$1; shift
  PYTHONPATH=/tmp/site:$tree/python EMBER_DEV_BUILD=$tree/build/dev timeout 170 python3 -m ember.bench \
    --bandwidth 3000 "$@" 2>&1 | grep -v "^| model\|^|---"
}
row() {   # row NAME ARGS...
  echo "== $(date +%T) $1"
  local name=$1; shift
  echo "base: $(bench /tmp/base "$@" | tr '\n' ' ')"
  echo "new:  $(bench "$PWD" "$@" | tr '\n' ' ')"
}
for r in ${ROWS:-q4_0 q8_0 q4_k_m f16 depth depth_q8 ngl16 ngl16_mmp0}; do
  case $r in
    q4_0|q8_0|q4_k_m|f16) row $r -m /tmp/em/l7b-$r.gguf -ngl -1 -p 512 -n 128 -r 3 ;;
    depth) row $r -m /tmp/em/l7b-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -r 2 ;;
    depth_q8) row $r -m /tmp/em/l7b-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -ctk q8_0 -ctv q8_0 -r 2 ;;
    ngl16) row $r -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 512 -n 64 -r 3 ;;
    ngl16_mmp0) row $r -m /tmp/em/l7b-q4_0.gguf -ngl 16 -p 0 -n 64 -r 3 -mmp 0 ;;
  esac
done
