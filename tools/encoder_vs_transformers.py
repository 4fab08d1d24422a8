"""A real sentence-transformers model (a folder with config.json, model.safetensors, the tokenizer and
its modules.json) run by transformers and by ember on 200 sentences: the cosine of each embedding
pair, and whether ten queries rank the sentences alike. Two steps, since transformers and ember live
in different environments:

    /tmp/hfenv/bin/python tools/encoder_vs_transformers.py reference MODEL_DIR OUT.npz
    EMBER_DEV_BUILD=build/dev PYTHONPATH=python python tools/encoder_vs_transformers.py compare OUT.npz MODEL.gguf

The reference applies the folder's sentence-transformers Pooling (mean or cls) and Normalize modules
itself, as that library defines them. ember embeds both transformers' token ids (the model alone)
and its own tokenization of the texts (the whole path)."""
import argparse
import json
import os

import numpy as np

_SUBJECTS = ["The cat", "A young engineer", "My neighbour", "The old bridge", "Our team", "The river", "A small bird",
             "The committee", "This recipe", "The new library", "A quiet student", "The storm"]
_VERBS = ["crossed", "described", "repaired", "ignored", "celebrated", "flooded", "painted", "questioned", "built",
          "delayed", "explained", "visited"]
_OBJECTS = ["the busy market", "a broken window", "the annual budget", "the mountain trail", "an ancient map",
            "the football final", "a chocolate cake", "the train station", "a difficult exam", "the city council",
            "the summer festival", "a rusty bicycle"]
_TAILS = ["yesterday.", "before sunrise.", "with great care.", "for the third time.", "without any warning.",
          "during the holidays.", "in the rain.", "after a long debate."]
QUERIES = ["weather damage to buildings", "cooking and baking desserts", "public transport delays",
           "sports events and games", "fixing old things", "local government money", "animals and birds",
           "students and exams", "travel in the mountains", "art and painting"]


def sentences(n=200, seed=7):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        s = " ".join(str(rng.choice(p)) for p in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS))
        if s not in out:
            out.append(s)
    return out


def _pooling(model_dir):
    with open(os.path.join(model_dir, "modules.json"), encoding="utf-8") as f:
        modules = json.load(f)
    pool = next(m for m in modules if m["type"].endswith("Pooling"))
    with open(os.path.join(model_dir, pool["path"], "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    return ("cls" if cfg.get("pooling_mode_cls_token") else "mean"), normalize


def reference(model_dir, out):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    pooling, normalize = _pooling(model_dir)
    texts = sentences() + QUERIES
    ids, embs = [], []
    for text in texts:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0].double().numpy()
        e = h[0] if pooling == "cls" else h.mean(axis=0)
        embs.append(e / np.linalg.norm(e) if normalize else e)
        ids.append(enc["input_ids"][0].tolist())
    np.savez(out, embeddings=np.array(embs), ids=np.array(json.dumps(ids)), texts=np.array(json.dumps(texts)),
             normalize=normalize)


def _ranks(emb, n_docs):
    docs, queries = emb[:n_docs], emb[n_docs:]
    docs = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    return np.argsort(-(queries @ docs.T), axis=1)


def compare(ref_path, gguf_path, n_threads=2):
    from ember import _ember

    ref = np.load(ref_path)
    want = ref["embeddings"]
    ids, texts = json.loads(str(ref["ids"])), json.loads(str(ref["texts"]))
    m = _ember.Model(gguf_path)
    enc = _ember.Encoder(m, n_threads=n_threads)
    own = [list(m.tokenizer.encode(t, add_bos=True)) for t in texts]
    n_docs = len(texts) - len(QUERIES)
    for label, seqs in (("transformers' ids", ids), ("ember's tokenizer", own)):
        got = np.asarray(enc.encode(seqs), np.float64)
        if bool(ref["normalize"]):
            got = got / np.linalg.norm(got, axis=1, keepdims=True)
        cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        same_ids = sum(a == b for a, b in zip(seqs, ids))
        r_got, r_want = _ranks(got, n_docs), _ranks(want, n_docs)
        top10 = all(list(a[:10]) == list(b[:10]) for a, b in zip(r_got, r_want))
        print(f"{os.path.basename(gguf_path)} {label}: {len(seqs)} texts ({same_ids} tokenized alike), cosine min "
              f"{cos.min():.7f} mean {cos.mean():.7f}; max|diff| {np.abs(got - want).max():.2e}; the ten queries' "
              f"top-10 rankings {'identical' if top10 else 'DIFFER'}; full rankings identical: "
              f"{bool(np.all(r_got == r_want))}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("reference")
    r.add_argument("model_dir")
    r.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("reference")
    c.add_argument("gguf", nargs="+")
    args = parser.parse_args(argv)
    if args.step == "reference":
        reference(args.model_dir, args.out)
    else:
        for path in args.gguf:
            compare(args.reference, path)


if __name__ == "__main__":
    main()
