#!/usr/bin/env bash
# Build the extension with AddressSanitizer + UBSan (FASTDPR_SANITIZE=ON) into build/sanitize and run the index and
# fuzz tests against it (their subprocesses load the same build). Usage:
#   scripts/sanitize_index.sh [pytest args...]      tests named in the arguments (a path or path::test), else
#                                                   tests/test_index*.py tests/test_fuzz*.py without the FAISS/CLI
#                                                   file, whose torch and faiss imports are not under test; options
#                                                   (-x, -k EXPR, --durations=5) apply either way
#   SANITIZE_CLEAN=1 scripts/sanitize_index.sh      build from an empty build directory
# `make sanitize` runs it. It works from a fresh clone (no build/ yet) once `make setup` has made the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BUILD=build/sanitize
if [ "${SANITIZE_CLEAN:-0}" != 0 ]; then
  rm -rf "$BUILD"
fi
# a build directory configured from another checkout (a copied tree) cannot be reused
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD"
fi
mkdir -p "$BUILD"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DFASTDPR_SANITIZE=ON \
      -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" \
      -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" > "$BUILD/cmake.log" 2>&1; then
  tail -n 30 "$BUILD/cmake.log" >&2
  exit 1
fi
if ! cmake --build "$BUILD" -j "${JOBS:-2}" > "$BUILD/build.log" 2>&1; then
  grep -E "error|Error" "$BUILD/build.log" | head -n 30 >&2 || tail -n 30 "$BUILD/build.log" >&2
  exit 1
fi
EXT=$(ls "$PWD/$BUILD"/_C*.so | head -1)
selected=0
for arg in "$@"; do
  case "$arg" in *::*) selected=1 ;; *) [ -e "$arg" ] && selected=1 ;; esac
done
if [ "$selected" = 0 ]; then
  set -- "$@" $(ls tests/test_index*.py tests/test_fuzz*.py | grep -v test_index_faiss_cli.py)
fi
# Python itself is not built with ASan: preload the runtime (and libstdc++, or ASan cannot find the real
# __cxa_throw when the extension throws), ignore leaks of the interpreter at exit, stop on the first real error.
# allocator_may_return_null: an allocation ASan cannot serve is std::bad_alloc (a MemoryError), as without ASan.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export FASTDPR_SANITIZED_EXTENSION="$EXT"
export PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
echo "sanitizer build: $EXT" >&2
exec "$PY" -m pytest -q -p _asan_extension -p no:cacheprovider "$@"
