#!/usr/bin/env bash
# The CPU's mixture-of-experts speed beside llama.cpp's on one file: a synthetic qwen3moe-2b (Qwen3-30B-A3B's
# layout, small enough for two threads) quantized by llama-quantize, then llama-bench and ember-bench with the
# same threads and tests, and the engine's decode at 1 and 8 sequences.
#   LLAMA_BIN=/path/to/llama.cpp/build/bin tools/cpu_moe_vs_llamacpp.sh [WORKDIR] [THREADS] [TYPE]
# LLAMA_BIN must hold llama-quantize and llama-bench (a CPU build of llama.cpp); ember from this tree
# (PYTHONPATH=python, EMBER_DEV_BUILD for a development build).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${1:-/tmp/cpu_moe}
THREADS=${2:-2}
TYPE=${3:-Q4_K_M}
BIN=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp build/bin}
mkdir -p "$WORK"
f16=$WORK/qwen3moe-2b-f16.gguf
model=$WORK/qwen3moe-2b-${TYPE,,}.gguf
[ -f "$WORK/vocab.gguf" ] || gunzip -c "$ROOT/tests/fuzz/vocab/smollm2.gguf.gz" > "$WORK/vocab.gguf"
[ -f "$f16" ] || python3 "$ROOT/tools/synthetic_gguf.py" --shape qwen3moe-2b --vocab "$WORK/vocab.gguf" --seed 0 -o "$f16"
[ -f "$model" ] || "$BIN/llama-quantize" "$f16" "$model" "$TYPE" "$THREADS" > "$WORK/quantize.log" 2>&1

echo "## llama-bench -t $THREADS"
"$BIN/llama-bench" -m "$model" -t "$THREADS" -p 512 -n 128 -r 3 2>&1 | grep -E "^\|"
echo "## ember-bench -t $THREADS"
python3 -m ember.bench -m "$model" -t "$THREADS" -p 512 -n 128 -r 3
echo "## ember-bench engine decode, 1 and 8 sequences"
python3 -m ember.bench -m "$model" -t "$THREADS" -npl 1,8 -npp 128 -ntg 64
