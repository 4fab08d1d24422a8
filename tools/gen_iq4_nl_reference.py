"""Writes tests/reference/quant/iq4_nl_ggml.npz: rows of random values (normal, heavy-tailed, tiny and huge,
ties between levels, zero blocks) and the IQ4_NL blocks ggml's reference quantizer (from_float_ref,
which llama.cpp's iq4_nl KV cache stores with) writes for them, through a llama.cpp build's libggml-base.
Run: python tools/gen_iq4_nl_reference.py /path/to/llama.cpp/build/bin/libggml-base.so"""
import ctypes
import pathlib
import sys

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference" / "quant" / "iq4_nl_ggml.npz"
GGML_TYPE_IQ4_NL = 20


class TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    tr = lib.ggml_get_type_traits(GGML_TYPE_IQ4_NL).contents
    assert tr.type_name == b"iq4_nl" and tr.type_size == 18
    quantize = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(tr.from_float_ref)
    rng = np.random.default_rng(20261207)
    n = 4096
    rows = [rng.standard_normal(n), rng.laplace(0, 0.05, n) * np.where(rng.random(n) < 0.01, 100.0, 1.0),
            rng.standard_normal(n) * 1e-6, rng.standard_normal(n) * 3e3, rng.uniform(0.5, 2.0, n)]
    ties = np.tile(np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], float), n // 16)
    rows.append(ties + np.where(np.arange(n) % 2 == 0, 0.5, -0.5) * rng.integers(0, 2, n))
    z = rng.standard_normal(n)
    z[:64] = 0.0
    rows.append(z)
    x = np.stack(rows).astype(np.float32)
    q = np.zeros((x.shape[0], n // 32 * 18), dtype=np.uint8)
    for r in range(x.shape[0]):
        quantize(x[r].ctypes.data, q[r].ctypes.data, n)
    np.savez_compressed(OUT, x=x, q=q)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
