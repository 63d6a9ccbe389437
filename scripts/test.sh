#!/usr/bin/env bash
# The whole test suite, as CI runs it (after scripts/setup.sh):
# C++ unit tests (ctest) and an nvcc compile of every CUDA kernel for sm_80/sm_90, then pytest
# (cross-backend, Triton interpreter and ahead-of-time compiles, loss, integrations, training).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci_native.sh
.venv/bin/python -m pytest python_tests -q -ra
