"""How llama.cpp itself scores on tests/reference/smollm2/greedy.jsonl under each of its
attention paths: the reference was made with flash attention (llama.cpp's default on CPU), and
this shows how many of the 8 prompts another valid arithmetic (-fa off) keeps over >= 16 tokens.

    python tools/llama_cpp_greedy.py /path/to/llama-completion MODEL.gguf [on off ...]

Prints, per -fa setting, the number of tokens matching the reference for each prompt and how
many prompts match over >= 16 tokens (the issue's bar is 7 of 8). Token ids come from ember's
tokenizer (PYTHONPATH=python, a built ember)."""
import json
import subprocess
import sys
from pathlib import Path

from ember.llama import Llama

REFS = Path(__file__).resolve().parents[1] / "tests" / "reference" / "smollm2" / "greedy.jsonl"


def main():
    binary, model, settings = sys.argv[1], sys.argv[2], sys.argv[3:] or ["on", "off"]
    refs = [json.loads(line) for line in REFS.read_text().splitlines()]
    llm = Llama(model, n_ctx=512, n_gpu_layers=0, verbose=False)
    for fa in settings:
        matches = []
        for ref in refs:
            text = subprocess.run([binary, "-m", model, "-p", ref["prompt"], "-n", str(ref["n_predict"]), "--temp", "0",
                                   "-c", "512", "-t", "2", "-fa", fa, "--no-display-prompt", "--simple-io", "-no-cnv",
                                   "--no-warmup"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  check=True).stdout
            ours = llm.tokenize(text.encode(), add_bos=False)
            theirs = llm.tokenize(ref["completion"].encode(), add_bos=False)
            first_diff = (i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            matches.append(next(first_diff, min(len(ours), len(theirs))))
        print(f"-fa {fa}: {matches}  {sum(m >= 16 for m in matches)}/{len(refs)} prompts over >= 16 tokens")


if __name__ == "__main__":
    main()
