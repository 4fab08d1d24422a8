#!/usr/bin/env bash
# Compile-check the CUDA backend on a machine without a GPU: nvcc builds cuda/ and the _ember module
# with EMBER_CUDA=ON (sm_90a only, to keep CI short); nothing is run. cuBLAS comes from the
# nvidia-cublas wheel where the system toolkit has none.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v nvcc >/dev/null; then
  echo "cuda compile check: no nvcc on this machine, skipped"
  exit 0
fi
python -m pip install -q nvidia-cublas nanobind
cmake -S . -B build/ci-cuda -G Ninja -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
cmake --build build/ci-cuda --target _ember
echo "cuda compile check: ok"
