#!/usr/bin/env bash
# Device diagnosis of a crash: the failing Python snippet under cuda-gdb (host backtrace), then
# the same snippet against a build without CUDA. Usage: bash tools/device/cuda_probe.sh
cd "$(dirname "$0")/../.."
source tools/device/cuda_build.sh || { echo "BUILD FAILED"; exit 1; }
cat > /tmp/probe.py <<'PY'
from ember import _ember as E
import numpy as np
try:
    E.Backend("cpu").matmul(12, np.ones((2, 100), np.uint8), 256, np.ones((1, 256), np.float32))
except ValueError as e:
    print("ValueError ok:", e)
PY
python3 /tmp/probe.py; echo "rc=$?"
cuda-gdb -q -batch -ex run -ex bt --args python3 /tmp/probe.py 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -30
ldd build/dev/_ember*.so | grep -E "stdc|gcc"
cmake -S . -B build/nocuda -G Ninja -DPython_EXECUTABLE="$(command -v python3)" >/dev/null && ninja -C build/nocuda _ember >/dev/null 2>&1
EMBER_DEV_BUILD=$PWD/build/nocuda python3 /tmp/probe.py; echo "nocuda rc=$?"
