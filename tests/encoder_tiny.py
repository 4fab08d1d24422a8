"""Tiny random encoder checkpoints (BERT, two rerankers, nomic-bert, EmbeddingGemma with its
sentence-transformers modules) and transformers' outputs on them, without torch or transformers.

tests/reference/encoders holds what tools/gen_encoder_references.py recorded once: each model's
config.json as transformers saves it, its tensor names and shapes, the sentence-transformers module
files, and transformers' last hidden states, pooled embeddings and classifier scores on SEQS. The
weights are drawn here from a seeded generator (models.json keeps their sha256)."""
import hashlib
import json
import os
import pathlib

import numpy as np

import hf_tiny

REFERENCE = hf_tiny.ROOT / "tests" / "reference" / "encoders"

# Packed together in one forward by the tests: lengths past the EmbeddingGemma window (8), a
# one-token sequence, and ids from 3 up (XLM-RoBERTa's padding id is 1).
_rng = np.random.default_rng(41)
SEQS = [[int(t) for t in _rng.integers(3, 400, size=n)] for n in (37, 5, 12, 1, 20)]
# BERT's segment ids for the cross-encoder: the "query" then the "document".
TYPES = [[0] * (n // 3 + 1) + [1] * (n - n // 3 - 1) for n in map(len, SEQS)]


def models(root=REFERENCE):
    with open(pathlib.Path(root) / "models.json", encoding="utf-8") as f:
        return json.load(f)


def _draw(seed, shapes):
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(shapes):
        x = rng.standard_normal(shapes[name])
        low = name.lower()
        if low.endswith("norm.weight"):
            x = 1.0 + 0.2 * x
        elif low.endswith(".bias"):
            x = 0.1 * x
        else:
            x = 0.08 * x
        out[name] = x.astype(np.float32)
    return out


def _sha(model_dir):
    digest = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(model_dir)):
        for name in sorted(files):
            if name.endswith(".safetensors"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def build(name, out_dir, root=REFERENCE):
    """Writes tiny encoder `name` (config, safetensors, bpe tokenizer, sentence-transformers
    modules) into out_dir; returns {relative safetensors path: {tensor: float32 array}}."""
    spec = models(root)[name]
    hf_tiny.copy_tokenizer("bpe", out_dir)
    written = {}
    for rel, files in spec["files"].items():
        os.makedirs(os.path.join(out_dir, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(out_dir, rel), "w", encoding="utf-8") as f:
            json.dump(files, f, indent=2, sort_keys=True)
    for k, (rel, shapes) in enumerate(sorted(spec["tensors"].items())):
        weights = _draw(spec["seed"] + 1000 * k, shapes)
        os.makedirs(os.path.join(out_dir, os.path.dirname(rel)), exist_ok=True)
        hf_tiny._write_safetensors(os.path.join(out_dir, rel), weights, "float32")
        written[rel] = weights
    if "sha256" in spec and _sha(out_dir) != spec["sha256"]:
        raise AssertionError(f"the weights of tiny encoder {name} differ from those the references were computed on: "
                             "rerun tools/gen_encoder_references.py")
    return written


class Reference:
    """transformers' outputs as tests/reference/encoders holds them."""

    def __init__(self, root=REFERENCE):
        with open(pathlib.Path(root) / "outputs.json", encoding="utf-8") as f:
            self.index = json.load(f)
        with np.load(pathlib.Path(root) / "outputs.npz") as z:
            self.arrays = dict(z)

    def get(self, model, what, i):
        """what: "hidden" [len, n_embd] (after the last block or norm), "pooled" [n_out] (the model's
        pooling and dense layers; the classifier's scores for rerankers)."""
        return self.arrays[self.index[model][what][i]]
