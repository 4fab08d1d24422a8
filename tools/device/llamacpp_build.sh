#!/usr/bin/env bash
# Builds llama.cpp's CUDA targets from a source tarball into /tmp/lcpp (the steps of
# llamacpp_on_gpu.sh build, kept here so the device runs need nothing outside the repo).
# Usage: llamacpp_build.sh TARBALL "TARGETS"
set -e
mkdir -p /tmp/lcpp && tar xJf "${1:?TARBALL}" -C /tmp/lcpp
cd /tmp/lcpp/llama.cpp
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > /tmp/lcpp/build.log 2>&1
cmake --build build -j "$(nproc)" --target ${2:-llama-bench} >> /tmp/lcpp/build.log 2>&1
echo "built in /tmp/lcpp/llama.cpp/build/bin: ${2:-llama-bench}"
