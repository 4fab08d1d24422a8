"""Remakes this folder's llama.cpp reference data for Gemma 3 270M (see README.md for the build):

    python make_reference.py LLAMA_BIN_DIR LLAMA_GREEDY MODEL.gguf

LLAMA_BIN_DIR holds llama-tokenize, llama-completion and llama-perplexity; LLAMA_GREEDY is
llama_greedy.cpp built against the same llama.cpp. Writes tokenize.jsonl and greedy.jsonl from
texts.json and prompts.json, and prints llama-perplexity's output for the -c 1024 figure."""
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
THREADS = "2"
N_PREDICT = 32
N_CTX = "1024"
PPL_TEXT = HERE.parent / "smollm2" / "apache-2.0.txt"


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, check=True).stdout


def tokenize(bin_dir, model, text, *flags):
    out = run([f"{bin_dir}/llama-tokenize", "-m", model, "--stdin", "--ids", "--no-escape", "--log-disable", *flags],
              stdin=text.encode("utf-8"))
    return json.loads(out.decode().strip().splitlines()[-1])


def main():
    bin_dir, greedy_bin, model = sys.argv[1:4]
    texts = json.loads((HERE / "texts.json").read_text(encoding="utf-8"))
    with open(HERE / "tokenize.jsonl", "w", encoding="utf-8") as f:
        for text in texts:
            row = {"text": text, "ids": tokenize(bin_dir, model, text),
                   "ids_no_special": tokenize(bin_dir, model, text, "--no-parse-special")}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    prompts = json.loads((HERE / "prompts.json").read_text(encoding="utf-8"))
    with open(HERE / "greedy.jsonl", "w", encoding="utf-8") as f:
        for prompt in prompts:
            completion = run([f"{bin_dir}/llama-completion", "-m", model, "-p", prompt, "-n", str(N_PREDICT),
                              "--temp", "0", "-c", N_CTX, "-t", THREADS, "--no-display-prompt", "--simple-io",
                              "-no-cnv", "--no-warmup"], stdin=b"").decode("utf-8")
            # llama-completion ends its output with a "\n\n" of its own, after the text, and marks an
            # end-of-generation token with " [end of text]\n".
            assert completion.endswith("\n\n"), completion
            completion = completion[:-2].removesuffix(" [end of text]\n")
            lines = dict(line.split(" ", 1) for line in
                         run([greedy_bin, model, str(N_PREDICT), N_CTX, THREADS, prompt]).decode().splitlines())
            greedy_text = bytes.fromhex(lines["text"].strip()).decode("utf-8")
            # The C API run and llama-completion are the same greedy decode; they must agree.
            assert greedy_text == completion, (prompt, greedy_text, completion)
            row = {"prompt": prompt, "n_predict": N_PREDICT, "completion": completion,
                   "prompt_ids": [int(x) for x in lines["prompt_ids"].split(",")],
                   "ids": [int(x) for x in lines["ids"].split(",")],
                   "top2_gaps": [float(x) for x in lines["gaps"].split(",")]}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    ppl = subprocess.run([f"{bin_dir}/llama-perplexity", "-m", model, "-f", str(PPL_TEXT), "-c", N_CTX, "-t", THREADS],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True).stdout.decode()
    print("\n".join(line for line in ppl.splitlines() if "[1]" in line or "estimate" in line or "tokenizing" in line))


if __name__ == "__main__":
    main()
