#!/usr/bin/env bash
# Device call: stage A (build, kernel tests, kernel bench, 7B models), then cuda_diag on a
# synthetic SmolLM2-shaped Q4_1 model (GPU vs CPU logits and ms/step, graphs and fusions on/off).
# Carry: build/carry build/parts/smol.part00
cd "$(dirname "$0")/../.."
bash tools/device/cuda_stage_a.sh
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 EMBER_DEV_BUILD=$PWD/build/dev
python3 build/carry/make_synthetic_gguf.py --shape smol-135m --vocab build/carry/vocab.gguf -o /tmp/em/smol-f16.gguf > /dev/null 2>&1
python3 -m ember.quantize -q /tmp/em/smol-f16.gguf /tmp/em/smol-q4_1.gguf Q4_1
timeout 120 python3 tools/device/cuda_diag.py /tmp/em/smol-q4_1.gguf 5
