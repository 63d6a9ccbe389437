#!/usr/bin/env bash
# The whole test suite, as CI runs it (after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest python_tests -q -ra
