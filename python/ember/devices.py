"""The CUDA devices of this machine and their free memory, read from the NVIDIA driver (libcuda)
through ctypes: LLM's gpu_memory_utilization and `ember --system-info` need them without a
backend being made. No driver or no device: an empty list."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import List, Optional


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    free_bytes: int
    total_bytes: int


def _driver() -> Optional[ctypes.CDLL]:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return lib if lib.cuInit(0) == 0 else None
    return None


def cuda_devices() -> List[CudaDevice]:
    """Every CUDA device with its name, free and total memory (free as the driver sees it now: what
    other processes and this one hold is taken)."""
    lib = _driver()
    if lib is None:
        return []
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    out = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, dev)
        # Free memory needs a context: the device's primary one, which the CUDA runtime (and so
        # ember's backend) shares, retained only for the question.
        ctx = ctypes.c_void_p()
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
            continue
        try:
            if lib.cuCtxPushCurrent_v2(ctx) == 0:
                lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            lib.cuDevicePrimaryCtxRelease_v2(dev)
        out.append(CudaDevice(i, name.value.decode("utf-8", errors="replace"), free.value, total.value))
    return out
