#!/usr/bin/env bash
# Build the extension with AddressSanitizer + UBSan (FASTDPR_SANITIZE=ON) into build/sanitize and run the index
# tests against it. Usage: scripts/sanitize_index.sh [pytest args...]   (default: tests/test_index*.py without the
# FAISS/CLI file, whose torch and faiss imports are not what is under test)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BUILD=build/sanitize
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DFASTDPR_SANITIZE=ON \
      -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" \
      -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" > "$BUILD.cmake.log"
cmake --build "$BUILD" -j "${JOBS:-2}" > "$BUILD.build.log"
EXT=$(ls "$PWD/$BUILD"/_C*.so | head -1)
if [ $# -eq 0 ]; then
  set -- $(ls tests/test_index*.py | grep -v test_index_faiss_cli.py)
fi
# Python itself is not built with ASan: preload the runtime (and libstdc++, or ASan cannot find the real
# __cxa_throw when the extension throws), ignore leaks of the interpreter at exit, stop on the first real error.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export FASTDPR_SANITIZED_EXTENSION="$EXT"
export PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec "$PY" -m pytest -q -p _asan_extension -p no:cacheprovider "$@"
