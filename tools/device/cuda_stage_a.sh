#!/usr/bin/env bash
# Device call A: build, kernel tests, kernel benchmark; meanwhile write the synthetic llama2-7b
# (F16, vocab from build/carry/vocab.gguf) and its Q4_0 / Q8_0 / Q4_K_M quantizations to /tmp/em,
# and stash the first half of SmolLM2 there (the model is larger than one call may carry; call
# B brings the second half). Carry: build/carry build/parts/smol.part00
set -o pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/em && cp build/parts/smol.part00 /tmp/em/
source tools/device/cuda_build.sh || { echo "BUILD FAILED"; exit 1; }
echo "libstdc++: $(ldd build/dev/_ember*.so | grep -c libstdc)"
( python3 build/carry/make_synthetic_gguf.py --shape llama2-7b --vocab build/carry/vocab.gguf -o /tmp/em/l7b-f16.gguf > /tmp/em/synth.log 2>&1
  for q in Q4_0 Q8_0 Q4_K_M; do python3 -m ember.quantize -q /tmp/em/l7b-f16.gguf /tmp/em/l7b-${q,,}.gguf $q >> /tmp/em/quant.log 2>&1; done ) &
python3 -m pytest tests/test_cuda.py -q -rs -k "not smollm" 2>&1 | tail -15
python3 -c "
from ember import _ember as E; import numpy as np
for kind in ('cpu', 'cuda'):
    try: E.Backend(kind).matmul(12, np.ones((2, 100), np.uint8), 256, np.ones((1, 256), np.float32))
    except ValueError as e: print(kind, 'ValueError ok:', e)
" 2>&1 | tail -3
build/dev/ember-cuda-bench 2>&1 | tee "$OUT/bench_kernels.md"
wait
tail -n 2 /tmp/em/synth.log /tmp/em/quant.log; ls -la /tmp/em
