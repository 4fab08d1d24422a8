"""use_mmap=False reads every tensor the CPU uses into memory at load: the file may then be cut
short (or replaced) under a loaded model, which generates on unchanged. Run in a child process,
since reading a truncated mapping is a SIGBUS, not an exception."""
import os
import shutil
import subprocess
import sys

CHILD = """
import os, sys
from ember import Llama
path = sys.argv[1]
llm = Llama(path, n_ctx=128, n_threads=2, use_mmap=False, verbose=False)
before = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
with open(path, "r+b") as f:
    f.truncate(4096)
after = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
assert after == before, (before, after)
print("same", repr(after))
"""


def test_a_model_read_into_memory_survives_its_file_being_cut(smollm2_path, tmp_path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, copy)
    r = subprocess.run([sys.executable, "-c", CHILD, str(copy)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("same")
