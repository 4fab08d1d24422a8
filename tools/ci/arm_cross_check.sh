#!/usr/bin/env bash
# CI: the C++ core builds for ARM64 (the x86 SIMD files left out, the NEON kernels and the scalar
# ones serving every type) and its CPU backend computes right there: cross-compiled with the OS's
# aarch64 GCC, then tools/ci/arm_smoke.cpp runs under qemu-user, at the NEON level (each NEON
# kernel against its scalar reference, and the matmuls) and with EMBER_SIMD=scalar (the matmuls
# on the scalar kernels alone). EMBER_ARM_BUILD names the build folder (default build/ci-arm).
set -euxo pipefail
cd "$(dirname "$0")/../.."
command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends g++-aarch64-linux-gnu qemu-user; }
B=${EMBER_ARM_BUILD:-build/ci-arm}
cmake -S . -B $B -G Ninja -DCMAKE_TOOLCHAIN_FILE=tools/ci/aarch64-toolchain.cmake -DEMBER_PYTHON=OFF \
  -DCMAKE_BUILD_TYPE=Release
cmake --build $B
aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -Wextra -Iinclude -Isrc tools/ci/arm_smoke.cpp \
  $B/libember_core.a $B/libember_backends.a $B/libember_kv.a $B/libember_cpu.a $B/libember_format.a \
  -lpthread -o $B/arm_smoke
qemu-aarch64 -L /usr/aarch64-linux-gnu $B/arm_smoke
EMBER_SIMD=scalar qemu-aarch64 -L /usr/aarch64-linux-gnu $B/arm_smoke
echo "arm cross check: ok"
