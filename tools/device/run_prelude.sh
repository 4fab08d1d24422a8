# Sourced by the device runs that follow engine_setup.sh (engine_bench.sh, host_kv_serving.sh) on
# the same warm machine: the log and its step lines, the SmolLM2 file put together once both
# carried parts have come (the carry limit takes one a call), and this tree's CUDA build.
LOG="${OUT:-/tmp}/bench.log"
step() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
cp build/parts/* /tmp/em/parts/ 2>/dev/null
[ -f /tmp/em/SmolLM2-135M-Instruct.Q4_1.gguf ] || [ ! -f /tmp/em/parts/smol.partab ] || [ ! -f /tmp/em/parts/smol.partaa ] ||
  cat /tmp/em/parts/smol.parta* > /tmp/em/SmolLM2-135M-Instruct.Q4_1.gguf
source tools/device/cuda_build.sh >> "$LOG" 2>&1 || { echo "BUILD FAILED"; tail -60 "$LOG"; exit 1; }
export EMBER_TEST_CACHE=/tmp/em
