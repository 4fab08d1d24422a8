"""ember-convert: a Hugging Face model directory (config.json, safetensors, tokenizer) -> one GGUF
file, written tensor by tensor with the gguf package's writer so memory stays near one tensor."""
import argparse
import json
import os
import sys

import numpy as np

from .convert_arch import arch_of, load_tensor, plan_tensors, read_hparams
from .convert_encoder import is_encoder, plan_encoder, write_keys
from .convert_error import ConvertError
from .convert_safetensors import Checkpoint
from .convert_vocab import PRE_NAMES, add_vocab, load_vocab

# --outtype -> (GGML type of 2-D weights, general.file_type).
OUTTYPES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
}

_ROWS_PER_CHUNK = 1024


def _tensor_type(gguf, name, shape, outtype):
    """Norms, biases (the experts' 2-D ones too) and other tensors whose name ends otherwise than in
    .weight (Mamba2's ssm_a, ssm_d), mixture routers, convolutions (ssm_conv1d, shortconv.conv),
    encoders' position and token type rows and other 1-D tensors stay F32 (small, and precision-sensitive;
    llama.cpp adds the last two to the F32 input as they are stored), as llama.cpp's converter keeps them;
    Q8_0 needs rows that are whole 32-element blocks, else the tensor falls back to F16."""
    if len(shape) < 2 or not name.endswith(".weight") or name.endswith((
            "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight",
            "shortconv.conv.weight")) or name in (
            "position_embd.weight", "token_types.weight"):
        return gguf.GGMLQuantizationType.F32
    qtype = getattr(gguf.GGMLQuantizationType, OUTTYPES[outtype][0])
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if shape[-1] % block:
        return gguf.GGMLQuantizationType.F16
    return qtype


def _nbytes(gguf, shape, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape, dtype=np.int64)) // block * size


def _encode(gguf, data, qtype):
    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        return data
    if qtype == T.F16:
        return data.astype(np.float16)
    # gguf's quantizers make several full-size temporaries: going by row chunks keeps the peak
    # near the f32 tensor plus its encoded copy.
    rows = data.reshape(-1, data.shape[-1])
    first = gguf.quants.quantize(rows[:_ROWS_PER_CHUNK], qtype)
    out = np.empty((rows.shape[0], first.shape[-1]), dtype=first.dtype)
    out[:len(first)] = first
    for i in range(_ROWS_PER_CHUNK, rows.shape[0], _ROWS_PER_CHUNK):
        out[i:i + _ROWS_PER_CHUNK] = gguf.quants.quantize(rows[i:i + _ROWS_PER_CHUNK], qtype)
    return out


def _model_name(model_dir, name):
    return name or os.path.basename(os.path.normpath(model_dir))


def convert(model_dir, out_path, outtype="f16", name=None, pre=None, progress=True):
    """Converts model_dir to out_path; raises ConvertError naming what is wrong. Everything is
    checked (config, tokenizer, tensor names and shapes) before the output file is created."""
    import gguf

    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype} (expected one of {', '.join(OUTTYPES)})")
    if not os.path.isdir(model_dir):
        raise ConvertError(f"model directory {model_dir} does not exist")
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(config_path):
        raise ConvertError(f"missing {config_path}")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as e:
        raise ConvertError(f"{config_path}: malformed JSON ({e})") from None

    if is_encoder(config):
        gguf_arch, keys, plans, checkpoint = plan_encoder(model_dir, config, config_path)
        text_config = config
    else:
        _, spec, text_config = arch_of(config, config_path)
        hp = read_hparams(text_config, spec, config_path)
        checkpoint = Checkpoint(model_dir)
        plans = plan_tensors(spec, hp, checkpoint)
        gguf_arch, keys = spec.gguf_arch, [("add_hparams", spec, hp)]
    # Special token ids may sit at the top level of a multimodal config, the vocab size in its text part.
    vocab = load_vocab(model_dir, {**config, **text_config}, pre)

    # The output's folder is made as needed (as `-o out/model.gguf` into a fresh folder expects).
    folder = os.path.dirname(os.path.abspath(out_path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConvertError(f"cannot make the output folder {folder}: {e.strerror or e}") from None
    writer = gguf.GGUFWriter(out_path, gguf_arch)
    try:
        writer.add_name(_model_name(model_dir, name))
        writer.add_type("model")
        writer.add_file_type(getattr(gguf.LlamaFileType, OUTTYPES[outtype][1]).value)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        write_keys(writer, keys)
        add_vocab(writer, vocab)
        types = []
        for p in plans:
            qtype = _tensor_type(gguf, p.gguf_name, p.shape, outtype)
            types.append(qtype)
            # The shape is given in numpy order with an explicit raw type, so no byte-shape guess.
            writer.add_tensor_info(p.gguf_name, p.shape, np.dtype(np.float32), _nbytes(gguf, p.shape, qtype),
                                   raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(plans), desc=f"ember-convert {outtype}", unit="tensor", file=sys.stderr)
        for p, qtype in zip(plans, types):
            writer.write_tensor_data(_encode(gguf, load_tensor(checkpoint, p), qtype))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        writer.close()
    except BaseException:
        writer.close()
        if os.path.exists(out_path):
            os.remove(out_path)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ember-convert",
                                     description="Convert a Hugging Face model directory to GGUF.")
    parser.add_argument("model_dir", help="directory with config.json, *.safetensors and the tokenizer")
    parser.add_argument("-o", "--outfile", required=True, help="output .gguf path")
    parser.add_argument("--outtype", default="f16", choices=sorted(OUTTYPES),
                        help="type of the 2-D weights (1-D tensors stay f32); default f16")
    parser.add_argument("--name", help="general.name (default: the directory name)")
    parser.add_argument("--pre", choices=PRE_NAMES,
                        help="byte-level BPE pre-tokenizer name, when it cannot be recognised")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    from .version import add_version
    add_version(parser)
    args = parser.parse_args(argv)
    from .cli import run_tool

    def run():
        convert(args.model_dir, args.outfile, args.outtype, args.name, args.pre, not args.no_progress)
        return 0

    return run_tool("ember-convert", run)


if __name__ == "__main__":
    sys.exit(main())
