"""vLLM's engine arguments as ember reads them: EngineArgs / AsyncEngineArgs (for
AsyncLLMEngine.from_engine_args), and what LLM makes of gpu_memory_utilization, dtype,
kv_cache_dtype, swap_space, tensor_parallel_size and trust_remote_code."""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional

from .devices import CudaDevice, cuda_devices

MIB = 1 << 20
# What the engine's activations and CUDA's own allocations take beside the KV pool.
GPU_HEADROOM_MB = 512

# vLLM's dtype names and the GGUF file types (general.file_type) that hold weights in that float type.
_DTYPES = {"float16": 1, "half": 1, "fp16": 1, "bfloat16": 32, "bf16": 32, "float32": 0, "float": 0, "fp32": 0}
_FILE_FLOAT_TYPES = {0: "float32", 1: "float16", 32: "bfloat16"}
# vLLM's kv_cache_dtype names that ember has a KV type for.
_KV_DTYPES = {"auto": None, "fp16": "f16", "float16": "f16", "f16": "f16", "float32": "f32", "fp32": "f32",
              "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "q8_0": "q8_0"}


class EngineArgs:
    """vLLM's EngineArgs: the keyword arguments of LLM, kept as attributes (model= names the GGUF)."""

    def __init__(self, model: Optional[str] = None, **kwargs):
        self.model = model
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({fields})"


class AsyncEngineArgs(EngineArgs):
    """vLLM's AsyncEngineArgs (the same fields here)."""


def engine_args_kwargs(engine_args) -> Dict[str, Any]:
    """LLM's keyword arguments from an EngineArgs, a dataclass, a dict or any object with
    attributes; None values are left out (LLM's defaults hold)."""
    if isinstance(engine_args, Mapping):
        given = dict(engine_args)
    elif dataclasses.is_dataclass(engine_args):
        given = dataclasses.asdict(engine_args)
    elif hasattr(engine_args, "__dict__"):
        given = dict(vars(engine_args))
    else:
        raise TypeError(f"from_engine_args: engine_args must be an EngineArgs, a dict or an object with "
                        f"attributes, got {type(engine_args).__name__}")
    return {k: v for k, v in given.items() if v is not None}


def kv_types_from_dtype(kv_cache_dtype: str, given: Mapping[str, Any]) -> Dict[str, str]:
    """type_k / type_v for vLLM's kv_cache_dtype ({} for auto); ValueError for a type ember has
    not, or beside type_k / type_v."""
    name = kv_cache_dtype.lower()
    if name not in _KV_DTYPES:
        raise ValueError(f"LLM: kv_cache_dtype {kv_cache_dtype!r} is not a KV cache type ember has; it takes "
                         f"{', '.join(_KV_DTYPES)} (fp8 KV caches are not supported)")
    kv = _KV_DTYPES[name]
    if kv is None:
        return {}
    if given.get("type_k") is not None or given.get("type_v") is not None:
        raise ValueError("LLM: give kv_cache_dtype (vLLM's) or type_k / type_v (llama.cpp's), not both")
    return {"type_k": kv, "type_v": kv}


def host_tier_mb(swap_space: Optional[float], given: Mapping[str, Any]) -> Dict[str, float]:
    """kv_host_mb for vLLM's swap_space (GiB of host memory for swapped-out KV)."""
    if swap_space is None:
        return {}
    if given.get("kv_host_mb") is not None:
        raise ValueError("LLM: swap_space (GiB, vLLM's) and kv_host_mb (MiB) both size the KV host tier; give one")
    return {"kv_host_mb": float(swap_space) * 1024.0}


def check_parallel(tensor_parallel_size: int) -> None:
    if tensor_parallel_size != 1:
        raise ValueError(f"LLM: tensor_parallel_size={tensor_parallel_size}: ember runs a model on one GPU "
                         f"(n_gpu_layers places its blocks there); use tensor_parallel_size=1")


def check_dtype(dtype: str, file_type: int) -> None:
    """vLLM's dtype against the GGUF: "auto" always; a float type must be the one an unquantized
    file holds (ember computes in the file's own types); a quantized file takes any."""
    name = dtype.lower()
    if name == "auto":
        return
    if name not in _DTYPES:
        raise ValueError(f"LLM: dtype {dtype!r} is not one of auto, {', '.join(_DTYPES)}")
    held = _FILE_FLOAT_TYPES.get(file_type)
    if held is not None and _DTYPES[name] != file_type:
        raise ValueError(f"LLM: dtype={dtype!r}, but this GGUF holds {held} weights and ember computes in the file's "
                         f"own types: use dtype='auto' or {held!r} (or convert the model to {name})")


def note_ignored(given: Mapping[str, Any]) -> None:
    if given.get("trust_remote_code"):
        print("ember: note: trust_remote_code is ignored: a GGUF file runs no code of its own", file=sys.stderr)


def kv_mb_for_utilization(utilization: float, n_gpu_blocks: int, n_layer: int, device: int = 0,
                          devices: Callable[[], List[CudaDevice]] = cuda_devices) -> float:
    """The KV pool (MiB, every layer's) that keeps this process within utilization of the GPU's
    memory, as vLLM's gpu_memory_utilization: the budget is that share of the device's total,
    less what is in use once the weights are loaded (this process's and others') and a margin for
    activations. With blocks on the host too, their KV is in host memory: the pool grows by
    n_layer / n_gpu_blocks. 0 (the engine's default pool) without a GPU."""
    found = {d.index: d for d in devices()}
    if n_gpu_blocks <= 0 or device not in found:
        return 0.0
    d = found[device]
    budget = d.free_bytes - (1.0 - utilization) * d.total_bytes
    gpu_mb = budget / MIB - GPU_HEADROOM_MB
    if gpu_mb <= 0:
        raise ValueError(f"LLM: gpu_memory_utilization={utilization:g} leaves no room for the KV cache on GPU {device} "
                         f"({d.name}): {(d.total_bytes - d.free_bytes) / MIB:.0f} of {d.total_bytes / MIB:.0f} MiB are "
                         f"in use with the weights loaded; raise it, or give kv_mb")
    return gpu_mb * n_layer / min(n_gpu_blocks, n_layer)
