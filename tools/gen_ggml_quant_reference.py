"""Writes tests/reference/quant/<type>_ggml.npz for the quantizers ember writes as ggml's reference ones (IQ4_NL,
which llama.cpp's iq4_nl KV cache stores with; Q2_K; Q3_K; IQ4_XS; IQ4_NL with the search llama-quantize
writes its weights with, iq4_nl_search), and as llama-quantize writes them through ggml_quantize_chunk: without
importances, <type>_search (IQ3_XXS, IQ3_S, IQ2_S), and with, <type>_imatrix, whose npz also holds the
importances qw (Q2_K to Q6_K, Q4_0 to Q5_1, IQ4_XS, IQ4_NL, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
IQ1_M; IQ1_M also without, iq1_m_search): rows of random values (normal, heavy-tailed, tiny and huge, ties between
IQ4_NL's levels, zero blocks; for IQ1 also a row of few distinct values, whose ties the sub-block search sorts) and
the blocks ggml writes for them, through a llama.cpp build's libggml-base.
Run: python tools/gen_ggml_quant_reference.py /path/to/llama.cpp/build/bin/libggml-base.so [TYPE ...]"""
import ctypes
import pathlib
import sys

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference" / "quant"
# ggml type id, values a block, bytes a block
TYPES = {"iq4_nl": (20, 32, 18), "q2_k": (10, 256, 84), "q3_k": (11, 256, 110), "iq4_xs": (23, 256, 136),
         "iq4_nl_search": (20, 32, 18), "q2_k_imatrix": (10, 256, 84), "q3_k_imatrix": (11, 256, 110),
         "iq4_xs_imatrix": (23, 256, 136), "iq4_nl_imatrix": (20, 32, 18), "iq3_xxs_search": (18, 256, 98),
         "iq3_xxs_imatrix": (18, 256, 98), "iq3_s_search": (21, 256, 110), "iq3_s_imatrix": (21, 256, 110),
         "iq2_xxs_imatrix": (16, 256, 66), "iq2_xs_imatrix": (17, 256, 74), "iq2_s_search": (22, 256, 82),
         "iq2_s_imatrix": (22, 256, 82), "q4_0_imatrix": (2, 32, 18), "q4_1_imatrix": (3, 32, 20),
         "q5_0_imatrix": (6, 32, 22), "q5_1_imatrix": (7, 32, 24), "q4_k_imatrix": (12, 256, 144),
         "q5_k_imatrix": (13, 256, 176), "q6_k_imatrix": (14, 256, 210), "iq1_s_imatrix": (19, 256, 50),
         "iq1_m_imatrix": (29, 256, 56), "iq1_m_search": (29, 256, 56)}


class TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def rows(n=4096):
    rng = np.random.default_rng(20261207)
    out = [rng.standard_normal(n), rng.laplace(0, 0.05, n) * np.where(rng.random(n) < 0.01, 100.0, 1.0),
           rng.standard_normal(n) * 1e-6, rng.standard_normal(n) * 3e3, rng.uniform(0.5, 2.0, n)]
    levels = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], float)
    out.append(np.tile(levels, n // 16) + np.where(np.arange(n) % 2 == 0, 0.5, -0.5) * rng.integers(0, 2, n))
    z = rng.standard_normal(n)
    z[:64] = 0.0
    out.append(z)
    return np.stack(out).astype(np.float32)


def tied_row(n=4096):
    """Few distinct values (many equal within a sub-block), a few of them large."""
    rng = np.random.default_rng(20261209)
    return (rng.integers(-3, 4, n) * 0.02 * np.where(rng.random(n) < 0.02, 10.0, 1.0)).astype(np.float32)


def importances(n=4096):
    """Per column, log-normal (a few columns far above the rest, as real activations' mean squares), and a
    run of zeros (columns no token reached)."""
    rng = np.random.default_rng(20261208)
    qw = np.exp(2.0 * rng.standard_normal(n))
    qw[100:110] = 0.0
    return qw.astype(np.float32)


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    qw = importances()
    for name in sys.argv[2:] or TYPES:
        x = np.vstack([rows(), tied_row()]) if name.startswith("iq1") else rows()
        type_id, elems, nbytes = TYPES[name]
        tr = lib.ggml_get_type_traits(type_id).contents
        assert tr.type_name.decode().lower() == name.removesuffix("_search").removesuffix("_imatrix")
        assert tr.type_size == nbytes
        quantize = tr.from_float_ref and ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_int64)(tr.from_float_ref)
        q = np.zeros((x.shape[0], x.shape[1] // elems * nbytes), dtype=np.uint8)
        for r in range(x.shape[0]):
            if name.endswith(("_search", "_imatrix")):   # what llama-quantize writes: ggml_quantize_chunk
                weights = ctypes.c_void_p(qw.ctypes.data) if name.endswith("_imatrix") else None
                lib.ggml_quantize_chunk(type_id, ctypes.c_void_p(x[r].ctypes.data), ctypes.c_void_p(q[r].ctypes.data),
                                        ctypes.c_int64(0), ctypes.c_int64(1), ctypes.c_int64(x.shape[1]), weights)
            else:
                quantize(x[r].ctypes.data, q[r].ctypes.data, x.shape[1])
        extra = {"qw": qw} if name.endswith("_imatrix") else {}
        np.savez_compressed(OUT / f"{name}_ggml.npz", x=x, q=q, **extra)
        print(f"wrote {OUT / f'{name}_ggml.npz'}")


if __name__ == "__main__":
    main()
