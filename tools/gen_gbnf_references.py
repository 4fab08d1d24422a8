"""Writes tests/reference/gbnf/llamacpp_greedy.json: llama.cpp's greedy completions of SmolLM2-135M
under llama.cpp's own grammar files (grammars/*.gbnf of the llama-cpp-python sdist), which
tests/test_structured.py feeds through ember's grammar matcher token by token.

    python tools/gen_gbnf_references.py --llama-completion /path/to/llama.cpp/build/bin/llama-completion
"""
import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import LLAMACPP_SDIST, _fetch_llamacpp_grammars, _fetch_smollm2  # noqa: E402
from test_structured import CHAT, LLAMACPP_GBNF_PROMPTS  # noqa: E402

OUT = ROOT / "tests" / "reference" / "gbnf" / "llamacpp_greedy.json"
END = " [end of text]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-completion", required=True, help="llama.cpp's llama-completion binary")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)
    grammars, model = _fetch_llamacpp_grammars(), _fetch_smollm2()
    out = {"source": f"llama-completion --temp 0 -n {args.max_tokens}, grammars of {LLAMACPP_SDIST}",
           "completions": {}}
    for name, prompt in sorted(LLAMACPP_GBNF_PROMPTS.items()):
        prompt_text = CHAT.format(prompt)
        run = subprocess.run([args.llama_completion, "-m", str(model), "-no-cnv", "-p", prompt_text, "--grammar-file",
                              str(grammars / name), "-n", str(args.max_tokens), "--temp", "0", "-t", "2",
                              "--no-warmup"], capture_output=True, text=True, check=True)
        # It echoes the prompt (its special tokens left out), then the completion.
        text = run.stdout.split("assistant\n", 1)[1]
        stopped = END in text
        # A completion cut at -n ends with the newlines the program prints on exit: dropped (a prefix of it is checked).
        out["completions"][name] = {"text": text.split(END)[0] if stopped else text.rstrip("\n"),
                                    "stopped": stopped}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
