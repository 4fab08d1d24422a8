#!/usr/bin/env bash
# Device machine: build ember with the CUDA backend (sm_90) into build/dev and install the
# carried gguf wheel (and, where carried, the server's wheels from build/carry/srv: the machine has
# no network) into /tmp/site. Sourced by the other scripts (sets PYTHONPATH etc.).
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site build/carry/wheels/*.whl || return 1
if [ -d build/carry/srv ] && [ ! -d /tmp/site/fastapi ]; then
  python3 -m pip install -q --no-index --find-links build/carry/srv --no-compile --target /tmp/site fastapi uvicorn jinja2 || return 1
fi
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/tests PYTHONUNBUFFERED=1 EMBER_DEV_BUILD=$PWD/build/dev
grep -q "CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/g++" build/dev/CMakeCache.txt 2>/dev/null || rm -rf build/dev
# The device image puts a GCC of its own (/opt/gcc) first, which links libstdc++ statically into
# shared objects; its locale is then never initialized (ostream number formatting segfaults).
# Build with the system compiler, whose libstdc++ is shared.
cxx=$(command -v /usr/bin/g++ || command -v g++); cc=$(command -v /usr/bin/gcc || command -v gcc)
cmake -S . -B build/dev -G Ninja -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CUDA_HOST_COMPILER="$cxx" \
      -DPython_EXECUTABLE="$(command -v python3)" >/dev/null || return 1
ninja -C build/dev _ember _ember_test ember_cuda_bench > /tmp/ninja.log 2>&1 || { grep -v '^\[' /tmp/ninja.log | head -60; return 1; }
