"""The command line as llama.cpp's users reach for it (issue 43): `ember -cnv` with a system prompt,
multi-line input and /exit, -i, -f FILE and a prompt on stdin, --system-info, ember-perplexity
--chunks, ember-quantize's summary and ember-convert making its output folder."""
import os
import re
import subprocess
import sys

import hf_tiny
from ember import _ember
from ember.cli_chat import read_turn

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def ember(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "ember.cli", *map(str, args)], input=stdin, capture_output=True,
                          text=True, env=ENV, timeout=300)


def test_read_turn_joins_continued_lines():
    lines = iter(["first \\", "second\\", "third", "next"])
    assert read_turn(lambda prompt: next(lines, None), "> ") == "first \nsecond\nthird"
    assert read_turn(lambda prompt: next(lines, None), "> ") == "next"
    assert read_turn(lambda prompt: next(lines, None), "> ") is None
    unfinished = iter(["open \\"])
    assert read_turn(lambda prompt: next(unfinished, None), "> ") == "open "


def test_chat_with_a_system_prompt_until_exit(smollm2_path):
    """-cnv was `argument -c/--ctx-size: invalid int value: 'nv'` before."""
    r = ember("-m", smollm2_path, "-cnv", "-sys", "Answer in one word.", "-n", "6", "--temp", "0", "-t", "2",
              stdin="What color is the sky?\\\nAnswer please.\nAnd grass?\n/exit\nnever read\n")
    assert r.returncode == 0, r.stderr
    replies = r.stdout.strip("\n").split("\n")
    assert len(replies) == 2 and all(replies), r.stdout
    same = ember("-m", smollm2_path, "--chat", "--system-prompt", "Answer in one word.", "-n", "6", "--temp", "0",
                 "-t", "2", stdin="What color is the sky?\\\nAnswer please.\n")
    assert same.stdout.strip("\n") == replies[0]   # the end of input ends the chat too
    as_llama_cli = ember("-m", smollm2_path, "-cnv", "-p", "Answer in one word.", "-n", "6", "--temp", "0", "-t", "2",
                         stdin="What color is the sky?\\\nAnswer please.\n")
    assert as_llama_cli.stdout == same.stdout   # llama-cli's -cnv -p: the system prompt
    bad = ember("-m", smollm2_path, "-sys", "x", "-p", "hi")
    assert bad.returncode == 1 and "-sys / --system-prompt is for a chat: add -cnv" in bad.stderr


def test_prompt_from_file_stdin_and_interactive(smollm2_path, tmp_path):
    prompt = "The capital of France is"
    by_flag = ember("-m", smollm2_path, "-p", prompt, "-n", "5", "--temp", "0", "-t", "2")
    (tmp_path / "p.txt").write_text(prompt)
    by_file = ember("-m", smollm2_path, "-f", tmp_path / "p.txt", "-n", "5", "--temp", "0", "-t", "2")
    by_stdin = ember("-m", smollm2_path, "-n", "5", "--temp", "0", "-t", "2", stdin=prompt)
    assert by_flag.returncode == by_file.returncode == by_stdin.returncode == 0, by_file.stderr + by_stdin.stderr
    assert by_flag.stdout == by_file.stdout == by_stdin.stdout and by_flag.stdout.strip()
    inter = ember("-m", smollm2_path, "-i", "-p", prompt, "-n", "5", "--temp", "0", "-t", "2",
                  stdin=" And the capital of Italy is\n/exit\n")
    assert inter.returncode == 0 and inter.stdout.startswith(prompt + by_flag.stdout.rstrip("\n")), inter.stdout
    assert len(inter.stdout.strip().splitlines()) >= 2
    missing = ember("-m", smollm2_path, "-f", tmp_path / "none.txt")
    assert missing.returncode == 1 and "none.txt" in missing.stderr and "Traceback" not in missing.stderr


def test_system_info_and_version():
    r = ember("--system-info")
    assert r.returncode == 0, r.stderr
    assert f"CPU SIMD level: {_ember.simd_level()}" in r.stdout and "backends: cpu" in r.stdout
    assert re.search(r"CUDA device|CUDA devices: none", r.stdout)
    v = ember("--version")
    assert v.returncode == 0 and v.stdout.startswith("ember ") and "backends:" in v.stdout


def test_perplexity_chunks(smollm2_path, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 120)
    r = subprocess.run([sys.executable, "-m", "ember.perplexity", "-m", smollm2_path, "-f", text, "-c", "128",
                        "--chunks", "2", "-t", "2"], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(r"perplexity: \d+ tokens, 2 chunks of 128", r.stdout) and "[2]" in r.stdout and "[3]" not in \
        r.stdout
    bad = subprocess.run([sys.executable, "-m", "ember.perplexity", "-m", smollm2_path, "-f", text, "--chunks", "0"],
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert bad.returncode == 1 and "--chunks must be" in bad.stderr


def test_quantize_prints_types_and_sizes(smollm2_path, tmp_path):
    out = tmp_path / "out" / "q.gguf"
    out.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "ember.quantize", smollm2_path, out, "Q4_K_M", "--allow-requantize",
                        "-t", "2"], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr
    table = r.stderr[r.stderr.index("type     tensors"):]
    # SmolLM2's 576-wide rows are no whole 256-element K-quant blocks: those tensors fall back to Q5_0.
    assert re.search(r"^Q5_0 +\d+ +Q4_1 x\d+", table, re.MULTILINE), table
    assert re.search(r"^file: [\d.]+ MiB -> [\d.]+ MiB \(\d+% of the input\)$", table, re.MULTILINE), table
    size_in, size_out = os.path.getsize(smollm2_path), os.path.getsize(out)
    assert ("warning: the output is not smaller than the input" in table) == (size_out >= size_in)


def test_convert_makes_its_output_folder(tmp_path):
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    hf_tiny.build("mistral-tied", str(model_dir))
    out = tmp_path / "a" / "b" / "tiny.gguf"
    r = subprocess.run([sys.executable, "-m", "ember.convert", model_dir, "-o", out, "--no-progress"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.is_file()
