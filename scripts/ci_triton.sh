#!/usr/bin/env bash
# The Triton backend's checks without a GPU, as two plain commands (python_tests/test_triton.py runs
# the same two from the ordinary suite): the kernels under Triton's interpreter against the
# reference (a few minutes), then triton.compile of every specialisation for sm_80 and sm_90
# (4-9 minutes on 2 cores from a cold Triton cache). TRITON_INTERPRET must be set before triton is
# imported for the first and unset for the second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TRITON_INTERPRET=1 "$PY" -m pytest python_tests/test_triton_interpreter.py \
    python_tests/test_triton_interpreter_safety.py python_tests/test_triton_interpreter_mixtures.py \
    -q -W ignore::RuntimeWarning
env -u TRITON_INTERPRET "$PY" -m bonkernels.triton.aot --arch 80 90 --jobs "${JOBS:-2}"
