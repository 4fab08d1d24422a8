#!/usr/bin/env bash
# Lint, in check mode: ruff on the Python (rules in pyproject.toml's [tool.ruff]) and clang-format on
# the C++ / CUDA (.clang-format), each at the version pinned here so CI and developers see the same
# findings. FIX=1 applies ruff's safe fixes and rewrites the C++ in place instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUFF_VERSION=0.17.6
CLANG_FORMAT_VERSION=23.1.5

if [ "$(ruff --version 2>/dev/null)" != "ruff $RUFF_VERSION" ] ||
   ! clang-format --version 2>/dev/null | grep -q "version $CLANG_FORMAT_VERSION\b"; then
  python -m pip install -q "ruff==$RUFF_VERSION" "clang-format==$CLANG_FORMAT_VERSION"
fi

# Generated files keep their generator's layout.
cxx_files() {
  git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.c' | grep -v '^src/tokenizer/unicode_tables\.cpp$'
}

status=0
if [ "${FIX:-0}" = 1 ]; then
  ruff check --fix python tests tools || status=1
  cxx_files | xargs clang-format -i
else
  ruff check python tests tools || status=1
  cxx_files | xargs clang-format --dry-run --Werror || status=1
fi
exit $status
