#!/usr/bin/env python3
"""Write a GGUF that holds only another GGUF's tokenizer.* metadata (no tensors): the --vocab
input of make_synthetic_gguf.py, small enough to carry to the device machine.

    make_vocab_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf vocab.gguf
"""
import sys

from gguf import GGUFReader, GGUFWriter, GGUFValueType


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    w = GGUFWriter(out, "llama")
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            w.add_key_value(key, values, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[field.data[0]]).decode("utf-8"), vtype)
        else:
            w.add_key_value(key, field.parts[field.data[0]].tolist()[0], vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
