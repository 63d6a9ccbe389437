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
# The same for the OpenRLHF and SkyRL adapters' tests (OpenRLHF pins transformers, torch comes with peft
# and torchdata; skyrl-train itself needs Python >= 3.12, skyrl 0.3.0 holds the same PPO utilities).
# flash-attn, vllm and deepspeed, which OpenRLHF imports at start-up, are GPU builds: the tests stand in
# for them at import time (python_tests/import_stubs.py); nothing they test calls them.
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps openrlhf==0.11.2 skyrl==0.3.0 \
    skyrl-gym==0.4.0 peft==0.21.2 torchdata==0.11.0
# --no-build-isolation: the build must see the torch installed above, not a fresh (CUDA) one.
.venv/bin/pip install --quiet --disable-pip-version-check --no-build-isolation -e .
echo "bonkernels is set up in .venv"
