"""The tiny models with rows of 256, for tests/test_quantize_arch_rules.py and the generator of its reference
(tools/gen_quantize_type_references.py): K types apply to them without falling back to 32-element blocks."""
import gguf
import numpy as np
from gguf import GGUFReader


def widened(src, dst, rng):
    """A copy of src whose matrices have rows of 256 (fresh random values): K types then apply without falling back
    to 32-element blocks, so the more-bits rules show as Q6_K / Q5_K. Only names, dimensions and metadata decide the
    types; neither quantizer checks shapes against the architecture."""
    r = GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            w.add_key_value(f.name, f.contents(), f.types[0],
                            f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if len(shape) >= 2 and shape[-1] >= 32:
            shape[-1] = 256
        w.add_tensor(t.name, rng.standard_normal(shape).astype(np.float16 if len(shape) >= 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
