#!/usr/bin/env bash
# CI: an ASan + UBSan build of the core (EMBER_SANITIZE=ON, GCC, in build/asan) runs the CPU test
# subset; any sanitizer report fails the run. Extra arguments go to pytest.
# Needs g++ with libasan/libubsan, cmake >= 3.24, ninja, and python with nanobind, numpy, gguf, pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=build/asan

# RelWithDebInfo for line numbers in reports, without -DNDEBUG so ember's assert()s run too.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g" -DEMBER_SANITIZE=ON -DEMBER_CUDA=OFF -DEMBER_PYTHON=ON \
  -DEMBER_TEST_MODULE=ON
cmake --build "$BUILD" -j "${JOBS:-2}" --target _ember _ember_test

# python is not instrumented, so the ASan runtime is preloaded ahead of libc's malloc. libstdc++ is
# preloaded too: python does not link it, and ASan resolves its __cxa_throw interceptor when it
# starts, so without it the first C++ exception aborts with "CHECK failed: ... real___cxa_throw".
export LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
# --capture=sys: a sanitizer report goes straight to fd 2; pytest's fd capture would swallow it
# with the aborted process.
# detect_leaks=0: LeakSanitizer would report CPython's (and numpy's) objects that live until exit,
# which are not ember's; leaks of ember's own objects are not checked here.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:suppressions=$PWD/tools/ci/asan.supp"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/tools/ci/ubsan.supp"
export EMBER_DEV_BUILD="$BUILD" PYTHONPATH=python:tests
# Covers: GGUF reader/writer, quant kernels (every SIMD level: test_lower_simd_levels and the
# attention/gemm reruns start fresh interpreters under the same sanitizers), tokenizer, sampling,
# CPU backend ops, batched matmul (exact and fast), the KV block pool and sequences, SmolLM2-135M
# forwards (f16, q8_0 and mixed KV caches), and the engine's threads under preemption, cancels and
# bad requests.
# About 1.5 min here (2 cores; the two perplexity runs ~40 s each), plus ~3 min to build.
# Left out: the RSS test. ASan's quarantine of freed memory (256 MiB) and its redzones grow VmRSS
# by ~100 MiB while the reader parses the vocabulary, so it measures ASan, not the mmap.
python -m pytest -q -rs -p no:cacheprovider --capture=sys --durations=10 -k "not resident_memory" "$@" \
  tests/test_gguf.py tests/test_quant.py tests/test_tokenizer.py tests/test_sampling.py \
  tests/test_backend_ops.py tests/test_gemm_cpu.py tests/test_gemm_fast_cpu.py tests/test_attention_simd.py \
  tests/test_model.py tests/test_kv_types.py tests/test_kv_cache.py
python -m pytest -q -rs -p no:cacheprovider --capture=sys --durations=5 "$@" tests/test_engine.py \
  -k "not cuda and (preemption or stress or cancel or close or bad or threads)"
