#!/usr/bin/env bash
# CI: the Python tests of the quant formats and kernels, the tokenizers, the tiny converted models
# and a few SmolLM2-135M forwards, run on ARM64: _ember and _ember_test are cross-built with the
# OS's aarch64 GCC against Debian bookworm's arm64 Python 3.11, which runs pytest under qemu-user.
# Any failing test fails the run. Needs root only to apt-get what is missing.
#
# The host's Python is left as it is (its pip only downloads): the arm64 .debs (python3.11, its headers,
# libstdc++) are fetched with debootstrap and unpacked with dpkg -x into a folder given to qemu's
# -L; the wheels the tests import (numpy, pytest, gguf, sentencepiece, tokenizers, ...) are the
# manylinux aarch64 ones from PyPI, installed with pip --target. Both are kept in the work folder
# (EMBER_ARM_PY_BUILD, default build/ci-arm-py), so a second run only rebuilds what changed and
# runs the tests. About 5 min on 2 cores from an empty folder, 3.5 min after that, nearly all of it
# the tests under emulation.
set -euxo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
W=${EMBER_ARM_PY_BUILD:-build/ci-arm-py}
mkdir -p "$W"
W=$(cd "$W" && pwd)
MIRROR=${EMBER_DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null && command -v debootstrap >/dev/null || \
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user debootstrap; }

# ---- the arm64 Python: bookworm's python3.11 and its headers (debootstrap resolves the dependencies;
# --download-only runs nothing of arm64, so no emulation and no chroot)
DEBS="python3.11,libpython3.11-dev,libstdc++6"
R=$W/rootfs
if [ "$(cat "$R/.debs" 2>/dev/null)" != "$DEBS $MIRROR" ]; then
  rm -rf "$R" "$W/debootstrap"
  debootstrap --arch=arm64 --download-only --variant=minbase --include="$DEBS" bookworm "$W/debootstrap" "$MIRROR"
  mkdir -p "$R"
  { set +x; } 2>/dev/null   # one trace line per .deb otherwise
  for deb in "$W"/debootstrap/var/cache/apt/archives/*.deb; do dpkg -x "$deb" "$R"; done
  set -x
  # qemu's -L falls back to the host's path where the folder lacks one: without these, the arm64
  # Python would see the host's /usr/lib/python3/dist-packages.
  mkdir -p "$R/usr/lib/python3/dist-packages" "$R/usr/local/lib/python3.11/dist-packages"
  # Debian's pyconfig.h only includes the multiarch one; the cross compiler gets the real one.
  mkdir -p "$W/include"
  cp -r "$R/usr/include/python3.11" "$W/include/"
  cp "$R/usr/include/aarch64-linux-gnu/python3.11/pyconfig.h" "$W/include/python3.11/pyconfig.h"
  rm -rf "$W/debootstrap"
  echo "$DEBS $MIRROR" > "$R/.debs"
fi

# ---- what the tests import, as aarch64 wheels. pip: tests/conftest.py fetches SmolLM2 with
# `sys.executable -m pip`. nanobind: CMake asks this Python where it is. tokenizers without its
# huggingface-hub: the tests only build tokenizers in memory.
WHEELS="numpy pytest gguf sentencepiece protobuf safetensors jinja2 nanobind pip"
S=$W/site
if [ "$(cat "$S/.wheels" 2>/dev/null)" != "$WHEELS tokenizers" ]; then
  rm -rf "$S"
  TARGET=(--target "$S" --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --abi abi3
          --abi none --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64)
  python3 -m pip install -q "${TARGET[@]}" $WHEELS
  python3 -m pip install -q "${TARGET[@]}" --no-deps tokenizers
  echo "$WHEELS tokenizers" > "$S/.wheels"
fi

# ---- `python3` for the host: the arm64 one under qemu. -s: no user site-packages of the host's.
# A test that starts a fresh interpreter runs sys.executable, an arm64 ELF the host kernel cannot
# exec (no binfmt_misc in CI), so sitecustomize points sys.executable here.
PY=$W/bin/python3
mkdir -p "$W/bin" "$W/py"
cat > "$PY" <<EOF
#!/bin/sh
export PYTHONPATH=$W/py:$S:$ROOT/python:$ROOT/tests
exec qemu-aarch64 -L $R $R/usr/bin/python3.11 -s "\$@"
EOF
chmod +x "$PY"
printf 'import sys\nsys.executable = "%s"\n' "$PY" > "$W/py/sitecustomize.py"
"$PY" -c 'import platform, sys; assert platform.machine() == "aarch64", platform.machine(); print(sys.version)'

# ---- the extension modules, cross-built. FindPython runs the interpreter above for the version
# and the extension suffix (cpython-311-aarch64-linux-gnu); the headers are given, as it would
# otherwise look under the host's /usr/include.
B=$W/build
cmake -S . -B "$B" -G Ninja -DCMAKE_TOOLCHAIN_FILE=tools/ci/aarch64-toolchain.cmake -DCMAKE_BUILD_TYPE=Release \
  -DEMBER_PYTHON=ON -DEMBER_TEST_MODULE=ON -DPython_EXECUTABLE="$PY" -DPython_INCLUDE_DIR="$W/include/python3.11"
cmake --build "$B" -j "${JOBS:-$(nproc)}" --target _ember _ember_test

# ---- the tests. Left out: CUDA, the hf_live comparisons (torch), the server and browser; of
# test_model.py the perplexity runs and the file-rewriting error tests (minutes each under
# emulation); of test_embeddings.py the SmolLM2 and server parts.
# OpenBLAS (numpy's) would otherwise start a thread per core, emulated, beside ember's pool.
export EMBER_DEV_BUILD=$B OPENBLAS_NUM_THREADS=1
M=tests/test_model.py
E=tests/test_embeddings.py
"$PY" -m pytest -q -rs -p no:cacheprovider --durations=10 -m "not hf_live" \
  --deselect tests/test_arch_hf.py::test_cuda_logits_match_cpu \
  tests/test_quant.py tests/test_tokenizer.py tests/test_arch_hf.py tests/test_convert.py \
  $E::test_hidden_states_match_transformers $E::test_pooling_matches_transformers $E::test_pooling_from_the_file \
  $M::test_hparams $M::test_bad_input_is_a_clear_error $M::test_no_mmap_copy_gives_the_same_logits \
  $M::test_truncate_then_continue $M::test_paging_and_batching_do_not_change_logits \
  "$M::test_q8_0_kv_cache_keeps_confident_greedy_tokens[The capital of France is]" "$@"
echo "arm python tests: ok"
