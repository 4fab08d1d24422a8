#!/usr/bin/env bash
# Device machine: build ember with the CUDA backend (sm_90) into build/dev and install the
# carried gguf wheel into /tmp/site. Sourced by the other scripts (sets PYTHONPATH etc.).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site build/carry/wheels/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 EMBER_DEV_BUILD=$PWD/build/dev
cmake -S . -B build/dev -G Ninja -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DPython_EXECUTABLE="$(command -v python3)" >/dev/null || return 1
ninja -C build/dev _ember ember_cuda_bench > /tmp/ninja.log 2>&1 || { grep -v '^\[' /tmp/ninja.log | head -60; return 1; }
