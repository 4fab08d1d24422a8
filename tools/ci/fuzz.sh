#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, ASan + UBSan) of the GGUF reader, the tokenizer and the
# sampler: builds tests/fuzz/ with clang and runs each target for FUZZ_SECONDS (default 60),
# starting from the seed corpus in tests/fuzz/corpus/<target>/. Fails on a crash, a sanitizer
# report, a hang (FUZZ_TIMEOUT seconds on one input, default 10) or a broken invariant; the input
# that did it is left in $FUZZ_OUT/<target>/ (replay: build/fuzzers/fuzz_<target> FILE).
# Needs clang and libFuzzer: apt-get install clang libclang-rt-14-dev (Debian 12).
#   tools/ci/fuzz.sh [TARGET...]    targets: gguf tokenizer sampler (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${FUZZ_SECONDS:-60}
build=${FUZZ_BUILD:-build/fuzzers}
out=${FUZZ_OUT:-$build/findings}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf tokenizer sampler)

cxx=${FUZZ_CXX:-$(command -v clang++ || true)}
[ -n "$cxx" ] || { echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
cmake -S tests/fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" > /dev/null
ninja -C "$build" $(printf 'fuzz_%s ' "${targets[@]}")

failed=()
for t in "${targets[@]}"; do
  # New inputs the run finds go to a scratch corpus; the committed seeds are only read.
  work="$out/$t"
  mkdir -p "$work/corpus"
  echo "== fuzz_$t: ${seconds}s"
  if "$build/fuzz_$t" -max_total_time="$seconds" -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "tests/fuzz/corpus/$t" \
       > "$work/log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done' "$work/log" || true
  else
    tail -n 40 "$work/log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs in $out/<target>/crash-*, timeout-*, oom-*)" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]}: no findings in ${seconds}s each"
