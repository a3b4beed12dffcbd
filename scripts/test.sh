#!/usr/bin/env bash
# Quickstart, command 2: set up, lint, and run the default test suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -m unit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check compiler tests benchmarks runtime_cpp/tools
# C++ style (.clang-format) of the runtime and the native tests (generated code excluded).
git ls-files -z 'runtime_cpp/*.h' 'runtime_cpp/*.cpp' 'tests/native/*.h' 'tests/native/*.cpp' \
    tests/kernels/cuda_emulation.h | xargs -0 .venv/bin/clang-format --dry-run -Werror
.venv/bin/mypy
.venv/bin/lint-imports  # the pipeline's import layers (pyproject [tool.importlinter])
export TVM_NUM_THREADS=${TVM_NUM_THREADS:-2}
# Two workers, whole files each (a file's module fixtures stay in one worker; the shared
# test models are built once under a lock: tests/conftest.py). NINFER_TEST_WORKERS=0 runs
# the suite in one process.
exec .venv/bin/pytest -n "${NINFER_TEST_WORKERS:-2}" --dist loadfile "$@"
