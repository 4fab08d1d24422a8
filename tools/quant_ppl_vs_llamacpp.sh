#!/usr/bin/env bash
# Issue 39's real-file check on the CPU: for each mix, llama-quantize (with llama-imatrix's matrix) and
# ember-quantize (with ember-imatrix's) quantize the same F16; the table holds llama-perplexity and
# ember-perplexity on llama-quantize's file, and llama-perplexity on ember-quantize's.
#
#   tools/quant_ppl_vs_llamacpp.sh LLAMA_BIN F16.gguf CALIBRATION.txt EVAL.txt OUT_DIR [MIX...]
#
# LLAMA_BIN: llama.cpp's build/bin (llama-imatrix, llama-quantize, llama-perplexity). ember's tools run as
# `python -m ember.*` (PYTHONPATH / EMBER_DEV_BUILD as for the tests). Threads: $THREADS (default 2);
# context: $CTX (default 256) for the matrices and the perplexities.
set -euo pipefail
[ $# -ge 5 ] || { sed -n '2,10p' "$0"; exit 2; }
bin=$1 f16=$2 calib=$3 text=$4 out=$5
shift 5
mixes=("$@")
[ ${#mixes[@]} -gt 0 ] || mixes=(IQ4_XS IQ4_NL IQ3_XXS IQ3_S IQ2_XXS IQ2_XS IQ2_S IQ1_S IQ1_M TQ2_0 Q2_K Q3_K_M)
t=${THREADS:-2} c=${CTX:-256}
mkdir -p "$out"
[ -f "$out/imatrix.llama.gguf" ] ||
  "$bin/llama-imatrix" -m "$f16" -f "$calib" -c "$c" -t "$t" -o "$out/imatrix.llama.gguf" > "$out/imatrix.llama.log" 2>&1
[ -f "$out/imatrix.ember.gguf" ] ||
  python -m ember.imatrix -m "$f16" -f "$calib" -c "$c" -t "$t" -o "$out/imatrix.ember.gguf" > "$out/imatrix.ember.log" 2>&1
ppl_llama() { "$bin/llama-perplexity" -m "$1" -f "$text" -c "$c" -t "$t" 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'; }
ppl_ember() { python -m ember.perplexity -m "$1" -f "$text" -c "$c" -t "$t" 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'; }
rel() { python3 -c "print(f'{($1 / $2 - 1) * 100:+.2f}%')"; }
echo "| mix | llama-perplexity, llama-quantize's file | ember-perplexity, same file | llama-perplexity, ember-quantize's file |"
echo "|---|---|---|---|"
for m in "${mixes[@]}"; do
  "$bin/llama-quantize" --imatrix "$out/imatrix.llama.gguf" "$f16" "$out/llama-$m.gguf" "$m" "$t" > "$out/llama-$m.log" 2>&1
  python -m ember.quantize -q "$f16" "$out/ember-$m.gguf" "$m" --imatrix "$out/imatrix.ember.gguf" > "$out/ember-$m.log" 2>&1
  a=$(ppl_llama "$out/llama-$m.gguf") b=$(ppl_ember "$out/llama-$m.gguf") e=$(ppl_llama "$out/ember-$m.gguf")
  echo "| $m | $a | $b ($(rel "$b" "$a")) | $e ($(rel "$e" "$a")) |"
done
