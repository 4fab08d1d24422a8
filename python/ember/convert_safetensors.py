"""Lazy reading of a Hugging Face checkpoint's safetensors files (sharded or not): one tensor at a
time through a memory map, so converting never holds more than one tensor of the model.
The header is parsed here rather than with safetensors' safe_open because its numpy backend
cannot return BF16 tensors, and BF16 is what most checkpoints are stored in."""
import json
import os
import struct

import numpy as np

from .convert_error import ConvertError

# safetensors dtype name -> numpy dtype of the stored elements (BF16 read as raw uint16).
_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


class _File:
    """One .safetensors file: an 8-byte little-endian header length, a JSON header giving each
    tensor's dtype, shape and [begin, end) byte range relative to the end of the header."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConvertError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if 8 + n > size:
                raise ConvertError(f"{path}: safetensors header length {n} exceeds the file size {size}")
            try:
                header = json.loads(f.read(n))
            except ValueError as e:
                raise ConvertError(f"{path}: malformed safetensors header ({e})") from None
        self.data_start = 8 + n
        self.tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if dtype not in _DTYPES:
                raise ConvertError(f"{path}: tensor {name} has unsupported dtype {dtype}")
            expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
            if end - begin != expected or self.data_start + end > size:
                raise ConvertError(f"{path}: tensor {name} byte range [{begin}, {end}) does not hold "
                                   f"{dtype} {list(shape)}")
            self.tensors[name] = (dtype, shape, begin)

    def load_f32(self, name):
        dtype, shape, begin = self.tensors[name]
        count = int(np.prod(shape, dtype=np.int64))
        raw = np.memmap(self.path, dtype=_DTYPES[dtype], mode="r", offset=self.data_start + begin,
                        shape=(count,))
        if dtype == "BF16":
            # bf16 is the top half of an f32: widen and shift into place.
            wide = raw.astype(np.uint32)
            wide <<= 16   # in place: no second full-size temporary
            out = wide.view(np.float32)
        else:
            out = raw.astype(np.float32)
        del raw
        return out.reshape(shape)


class Checkpoint:
    """All tensors of a model directory: model.safetensors.index.json's weight map when the
    checkpoint is sharded, else every *.safetensors file in the directory."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            names = sorted(set(weight_map.values()))
        else:
            names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
        if not names:
            others = [n for n in os.listdir(model_dir) if n.endswith((".bin", ".pt", ".pth"))]
            hint = f" (found {others[0]}: only safetensors checkpoints are supported)" if others else ""
            raise ConvertError(f"no model weights (*.safetensors) in {model_dir}{hint}")
        self._where = {}
        for n in names:
            path = os.path.join(model_dir, n)
            if not os.path.exists(path):
                raise ConvertError(f"missing weights file {path} (listed in {index})")
            shard = _File(path)
            for t in shard.tensors:
                self._where[t] = shard

    def names(self):
        return list(self._where)

    def shape(self, name):
        return self._where[name].tensors[name][1]

    def load_f32(self, name):
        return self._where[name].load_f32(name)
