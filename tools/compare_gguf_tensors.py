"""Compares two GGUF files tensor by tensor (ember-quantize's output against llama-quantize's for the same
input, recipe and importance matrix): per tensor, whether the types agree and the bytes are equal, and a
summary line. Run: python tools/compare_gguf_tensors.py A.gguf B.gguf"""
import sys

import numpy as np
from gguf import GGUFReader


def main() -> int:
    a, b = ({t.name: t for t in GGUFReader(p).tensors} for p in sys.argv[1:3])
    same = 0
    for name in sorted(set(a) | set(b)):
        ta, tb = a.get(name), b.get(name)
        if ta is None or tb is None:
            print(f"{name}: only in {'the second' if ta is None else 'the first'} file")
            continue
        if ta.tensor_type != tb.tensor_type:
            print(f"{name}: {ta.tensor_type.name} vs {tb.tensor_type.name}")
            continue
        xa, xb = np.asarray(ta.data).view(np.uint8).ravel(), np.asarray(tb.data).view(np.uint8).ravel()
        if np.array_equal(xa, xb):
            same += 1
        else:
            print(f"{name} ({ta.tensor_type.name}): {np.count_nonzero(xa != xb)} of {xa.size} bytes differ")
    print(f"{same} of {len(set(a) | set(b))} tensors byte-identical")
    return 0 if same == len(set(a) | set(b)) else 1


if __name__ == "__main__":
    sys.exit(main())
