#!/usr/bin/env bash
# Set up everything on a fresh machine: a virtual environment in .venv with pinned torch (CPU) and
# triton, the test and integration dependencies, and bonkernels itself (building its C++ extension).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
# verl pins versions that would replace torch: install it alone, its imports come from requirements.txt.
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps verl==0.9.1
# --no-build-isolation: the build must see the torch installed above, not a fresh (CUDA) one.
.venv/bin/pip install --quiet --disable-pip-version-check --no-build-isolation -e .
echo "bonkernels is set up in .venv"
