#!/usr/bin/env bash
# Device call 2 (after engine_setup.sh with LCPP_TARGETS="llama-bench llama-server", same warm
# machine): the host-KV tests on SmolLM2 (second part carried now), then on the synthetic llama2-7b
# Q4_0 side by side with llama.cpp: host KV (llama-bench -nkvo 1 against ember-bench -nkvo) and
# serving (llama-server -np 64 -cb -cram 0 against ember-server -np 64, both driven by
# ember-bench --serving with the same seed).
# Carry: build/carry/srv build/carry/wheels, and the SmolLM2 parts (build/parts/smol.parta*) the
# tests need, one a call where the carry limit allows no more: the file is put together once both
# parts have come.
# Env: PARTS=nkvo,serving (default both), TESTS=0 skips tests, N / C (serving requests / concurrency,
# default 128 / 64), EXTRA: a command run at the end.
cd "$(dirname "$0")/../.."
source tools/device/run_prelude.sh
M=/tmp/em/l7b-q4_0.gguf
BIN=/tmp/lcpp/llama.cpp/build/bin
PARTS=${PARTS:-nkvo,serving}
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 python3 -m pytest tests/test_host_kv.py tests/test_engine_host_tier.py -q -rs -p no:cacheprovider > "${OUT:-/tmp}/tests.log" 2>&1
  step "tests rc=$? $(tail -1 "${OUT:-/tmp}/tests.log")"
fi
if [[ $PARTS == *nkvo* ]]; then
  step "llama-bench -nkvo 1"
  timeout 150 $BIN/llama-bench -m $M -ngl 99 -nkvo 1 -p 512 -n 128 -r 2 2>&1 | grep -E "^\|" | tee -a "$LOG"
  timeout 150 $BIN/llama-bench -m $M -ngl 99 -nkvo 1 -p 0 -n 64 -d 4096 -r 1 2>&1 | grep -E "^\|" | tee -a "$LOG"
  step "ember-bench -nkvo (the default GPU cache of the host KV)"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -nkvo -p 512 -n 128 -r 2 2>&1 | tee -a "$LOG"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -nkvo -p 0 -n 64 -d 4096 -r 1 2>&1 | tee -a "$LOG"
  step "ember-bench -nkvo --kv-gpu-cache-mb 0 (every block over PCIe) and 512"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -nkvo --kv-gpu-cache-mb 0 -p 512 -n 128 -r 1 2>&1 | tee -a "$LOG"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -nkvo --kv-gpu-cache-mb 0 -p 0 -n 64 -d 4096 -r 1 2>&1 | tee -a "$LOG"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -nkvo --kv-gpu-cache-mb 512 -p 0 -n 64 -d 4096 -r 1 2>&1 | tee -a "$LOG"
  step "ember-bench, KV on the GPU"
  timeout 150 python3 -m ember.bench -m $M -ngl -1 -p 0 -n 64 -d 4096 -r 1 2>&1 | tee -a "$LOG"
  step "ember-bench -nkvo, q8_0 KV (half the bytes over PCIe)"
  timeout 120 python3 -m ember.bench -m $M -ngl -1 -nkvo -ctk q8_0 -ctv q8_0 -p 0 -n 64 -d 4096 -r 1 2>&1 | tee -a "$LOG"
fi
serve_bench() {   # name URL
  python3 -c "import time, urllib.request as u
for _ in range(180):
    try:
        u.urlopen('$2/health', timeout=2); break
    except Exception: time.sleep(1)"
  timeout 240 python3 -m ember.bench --serving "$2" -n "${N:-128}" -c "${C:-64}" --json "${OUT:-/tmp}/$1.json" 2>&1 | tee -a "$LOG"
}
if [[ $PARTS == *serving* ]]; then
  step "llama-server -np 64 -cb -cram 0"
  $BIN/llama-server -m $M -ngl 99 -np 64 -cb -fa on -cram 0 -c 65536 --port 8081 > /tmp/em/llama-server.log 2>&1 &
  lpid=$!
  serve_bench llama-server http://127.0.0.1:8081
  kill $lpid; wait $lpid 2>/dev/null
  step "ember-server -np 64"
  python3 -m ember.server -m $M -ngl -1 -np 64 -c 1024 --kv-mb 36000 --port 8080 > /tmp/em/ember-server.log 2>&1 &
  epid=$!
  serve_bench ember-server http://127.0.0.1:8080
  kill $epid; wait $epid 2>/dev/null
  tail -3 /tmp/em/ember-server.log | tee -a "$LOG"
fi
[ -n "$EXTRA" ] && { step "extra: $EXTRA"; eval "$EXTRA"; }
step "done"
