#!/usr/bin/env bash
# Device: build, write a synthetic SmolLM2-shaped model (random weights, Q4_1 and Q4_K_M), and
# run cuda_diag.py on it for prompts of 5 and 20 tokens. Carry: build/carry
cd "$(dirname "$0")/../.."
source tools/device/cuda_build.sh > /tmp/build.log 2>&1 || { echo "BUILD FAILED"; tail -30 /tmp/build.log; exit 1; }
mkdir -p /tmp/em
python3 build/carry/make_synthetic_gguf.py --shape smol-135m --vocab build/carry/vocab.gguf -o /tmp/em/smol-f16.gguf > /dev/null 2>&1
for q in Q4_1 Q4_K_M; do
  python3 -m ember.quantize -q /tmp/em/smol-f16.gguf /tmp/em/smol-${q,,}.gguf $q
  for n in 5 20; do echo "== $q prompt $n"; timeout 120 python3 tools/device/cuda_diag.py /tmp/em/smol-${q,,}.gguf $n; done
done
