"""Writes tests/reference/encoders: the tiny encoder checkpoints' layouts and what transformers
computes on them (tests/encoder_tiny.py builds the checkpoints; tests/test_encoders.py compares).

    PYTHONPATH=python:tests /tmp/hfenv/bin/python tools/gen_encoder_references.py [--out DIR]

Needs torch and transformers (5). sentence-transformers is not needed: its Pooling and Dense
modules are applied here in numpy, as that library defines them."""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import encoder_tiny  # noqa: E402
import hf_tiny  # noqa: E402

N_TOKENS = 404   # the bpe tokenizer's 400 tokens and 4 added ones
_BASE = dict(vocab_size=N_TOKENS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=64)
# name: (transformers class, config class, config overrides, pooling, seed)
MODELS = {
    "bert": ("BertModel", "BertConfig", dict(type_vocab_size=2), "mean", 1),
    "bert-cls": ("BertModel", "BertConfig", dict(type_vocab_size=2, num_hidden_layers=3), "cls", 2),
    "bert-reranker": ("BertForSequenceClassification", "BertConfig", dict(type_vocab_size=2, num_labels=1), "rank", 3),
    "xlmr-reranker": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                      dict(type_vocab_size=1, num_labels=1, pad_token_id=1, max_position_embeddings=66), "rank", 4),
    "nomic-bert": ("NomicBertModel", "NomicBertConfig",
                   dict(type_vocab_size=2, rope_parameters={"rope_type": "default", "rope_theta": 1000.0}), "mean", 5),
    "gemma-embedding": ("Gemma3TextModel", "Gemma3TextConfig",
                        dict(num_hidden_layers=3, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                             sliding_window=8, use_bidirectional_attention=True, rms_norm_eps=1e-6,
                             layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                             tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                                              "sliding_attention": {"rope_type": "default",
                                                                    "rope_theta": 10000.0}}),
                        "mean", 6),
}
DENSE = (96,)   # EmbeddingGemma's 2_Dense output width (3_Dense maps it back to hidden_size)


def _st_files(name, pooling):
    """sentence-transformers' module files of a mean / cls pooled model (none for rerankers)."""
    if pooling == "rank":
        return {}
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    files = {"1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_cls_token": pooling == "cls",
                                       "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
                                       "pooling_mode_lasttoken": False}}
    if name == "gemma-embedding":
        for idx, (folder, n_in, n_out) in enumerate((("2_Dense", 64, DENSE[0]), ("3_Dense", DENSE[0], 64)), 2):
            mods.append({"idx": idx, "name": str(idx), "path": folder, "type": "sentence_transformers.models.Dense"})
            files[f"{folder}/config.json"] = {"in_features": n_in, "out_features": n_out, "bias": False,
                                              "activation_function": "torch.nn.modules.linear.Identity"}
    files["modules.json"] = mods
    return files


def layouts(work):
    import torch
    import transformers
    from safetensors import safe_open

    out = {}
    for name, (cls, cfg_cls, overrides, pooling, seed) in MODELS.items():
        config = getattr(transformers, cfg_cls)(**{**_BASE, **overrides})
        model = getattr(transformers, cls)(config)
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        model.to(torch.float32).save_pretrained(d)
        with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
            saved = json.load(f)
        saved.pop("transformers_version", None)
        with safe_open(os.path.join(d, "model.safetensors"), framework="pt") as f:
            shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        files = {"config.json": saved, **_st_files(name, pooling)}
        tensors = {"model.safetensors": dict(sorted(shapes.items()))}
        for folder in ("2_Dense", "3_Dense"):
            if f"{folder}/config.json" in files:
                c = files[f"{folder}/config.json"]
                tensors[f"{folder}/model.safetensors"] = {"linear.weight": [c["out_features"], c["in_features"]]}
        out[name] = {"files": files, "tensors": tensors, "seed": seed, "pooling": pooling}
    return out


def _load(model_dir):
    import torch
    import transformers

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cls = getattr(transformers, json.load(f)["architectures"][0])
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True,
                                      attn_implementation="eager")
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{model_dir}: {problems}"
    return model.eval()


def outputs(root, work):
    import torch

    index, arrays = {}, {}
    for name, spec in encoder_tiny.models(root).items():
        d = os.path.join(work, name)
        weights = encoder_tiny.build(name, d, root=root)
        model = _load(d)
        index[name] = {"hidden": [], "pooled": []}
        for i, ids in enumerate(encoder_tiny.SEQS):
            kw = {"output_hidden_states": True}
            if name == "bert-reranker":
                kw["token_type_ids"] = torch.tensor([encoder_tiny.TYPES[i]])
            with torch.no_grad():
                res = model(torch.tensor([ids]), **kw)
            hidden = res.hidden_states[-1][0].numpy() if spec["pooling"] == "rank" else res.last_hidden_state[0].numpy()
            if spec["pooling"] == "rank":
                pooled = res.logits[0].numpy()
            elif spec["pooling"] == "cls":
                pooled = hidden[0]
            else:
                pooled = hidden.astype(np.float64).mean(axis=0)
            if name == "gemma-embedding":
                pooled = pooled @ weights["2_Dense/model.safetensors"]["linear.weight"].T.astype(np.float64)
                pooled = pooled @ weights["3_Dense/model.safetensors"]["linear.weight"].T.astype(np.float64)
            for what, value in (("hidden", hidden), ("pooled", pooled)):
                key = f"{name}_{what}_{i}"
                arrays[key] = np.asarray(value, dtype=np.float32)
                index[name][what].append(key)
    return index, arrays


def generate(out, work):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    specs = layouts(os.path.join(work, "layouts"))
    (out / "models.json").write_text(json.dumps(specs, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for name in specs:
        d = os.path.join(work, "built", name)
        encoder_tiny.build(name, d, root=out)
        specs[name]["sha256"] = encoder_tiny._sha(d)
    (out / "models.json").write_text(json.dumps(specs, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    index, arrays = outputs(out, os.path.join(work, "live"))
    (out / "outputs.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    np.savez_compressed(out / "outputs.npz", **arrays)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(encoder_tiny.REFERENCE), help="folder to write (default: %(default)s)")
    args = parser.parse_args(argv)
    from transformers.utils import logging

    logging.disable_progress_bar()
    assert hf_tiny.REFERENCE.exists()
    with tempfile.TemporaryDirectory() as work:
        generate(args.out, work)


if __name__ == "__main__":
    main()
