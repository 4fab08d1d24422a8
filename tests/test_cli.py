"""The command-line tools as a user runs them: subprocesses, their exit status and what they print."""
import ast
import importlib.metadata
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The subprocesses import ember the way this process did (installed, or EMBER_DEV_BUILD + PYTHONPATH).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def tool(module, *args, **kw):
    return subprocess.run([sys.executable, "-m", f"ember.{module}", *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=300, **kw)


def assert_one_line_error(res, prog, pattern):
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert re.match(rf"{prog}: error: .*{pattern}", last), res.stderr


def test_ctrl_c_stops_a_long_prompt_within_a_batch(smollm2_path):
    # ~8000 prompt tokens take about a minute on 2 cores; one 128-token batch well under a second.
    prompt = "The quick brown fox jumps over the lazy dog. " * 790
    proc = subprocess.Popen([sys.executable, "-m", "ember.cli", "-m", smollm2_path, "-p", prompt, "-n", "4",
                             "-c", "8192", "-b", "128", "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        err = []
        for line in proc.stderr:   # the load summary comes just before prompt processing starts
            err.append(line)
            if line.startswith("ember: loaded"):
                break
        time.sleep(2.0)
        assert proc.poll() is None, "".join(err)
        proc.send_signal(signal.SIGINT)
        t = time.perf_counter()
        out, rest = proc.communicate(timeout=60)
        elapsed = time.perf_counter() - t
    finally:
        proc.kill()
    assert proc.returncode == 130, rest
    assert elapsed < 5.0, f"took {elapsed:.1f} s to stop"
    assert "Traceback" not in rest and rest.strip() == "", rest
    assert out == ""   # stopped inside the prompt: nothing was generated


def test_closed_pipe_ends_quietly_by_sigpipe(smollm2_path):
    # As `ember ... | head -c 20`: the reader leaves long before the 200 tokens are written.
    proc = subprocess.Popen([sys.executable, "-m", "ember.cli", "-m", smollm2_path, "-p", "Once upon a time",
                             "-n", "200", "--temp", "0", "--echo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV)
    try:
        assert len(proc.stdout.read(20)) == 20
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert err == b""
    assert proc.returncode == -signal.SIGPIPE   # the shell reports 128 + 13 = 141, as for cat or grep


def test_out_of_memory_is_one_line(smollm2_path):
    res = tool("cli", "-m", smollm2_path, "-p", "hi", "-c", 1_000_000_000)
    assert_one_line_error(res, "ember", "out of memory")
    # A billion-token KV cache for ember-bench's depth.
    res = tool("bench", "-m", smollm2_path, "-d", 1_000_000_000, "-r", 1)
    assert_one_line_error(res, "ember-bench", "out of memory")


def test_every_tool_ends_with_one_line_error(smollm2_path, tmp_path):
    missing = tmp_path / "missing.gguf"
    assert_one_line_error(tool("cli", "-m", missing, "-p", "hi"), "ember", "missing.gguf")
    short = tmp_path / "short.txt"
    short.write_text("Too short to fill a chunk.")
    assert_one_line_error(tool("perplexity", "-m", smollm2_path, "-f", short), "ember-perplexity", "n_ctx 512")
    assert_one_line_error(tool("perplexity", "-m", smollm2_path, "-f", tmp_path), "ember-perplexity",
                          "Is a directory")
    assert_one_line_error(tool("bench", "-m", missing), "ember-bench", "missing.gguf")
    assert_one_line_error(tool("quantize", smollm2_path, tmp_path / "out.gguf", "Q3_X", "-q"), "ember-quantize",
                          "Q3_X")
    assert_one_line_error(tool("convert", tmp_path, "-o", tmp_path / "out.gguf"), "ember-convert", "config.json")


def _third_party_imports(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names}


def test_plain_install_has_what_the_converter_imports():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[ <>=!\[;]", d)[0].lower() for d in project["dependencies"]}
    by_module = importlib.metadata.packages_distributions()
    needed = set()
    for path in (ROOT / "python" / "ember").glob("convert*.py"):
        for module in _third_party_imports(path):
            needed.update(d.lower() for d in by_module[module])
    # sentencepiece's sentencepiece_model_pb2 imports google.protobuf without declaring it.
    if "sentencepiece" in needed:
        needed.add("protobuf")
    assert {"sentencepiece", "protobuf", "tqdm"} <= needed
    assert needed <= deps, f"ember-convert imports {sorted(needed - deps)}, missing from a plain install"
    assert {"sentencepiece", "protobuf"} <= set(project["optional-dependencies"]["convert"])
