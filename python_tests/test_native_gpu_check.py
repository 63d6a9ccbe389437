"""bench/gpu_check.py runs blind on the GPU machine: keep its comparison and timing code working.

``--dry-run`` drives the same code paths with the CPU kernel (small sizes, no build).
"""

import subprocess
import sys
from pathlib import Path

import pytest

from bonkernels import _native

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not _native.available(), reason="native extension not built")
def test_gpu_check_dry_run_passes():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "[check] native:" in out and " 0 failed" in out, out[-3000:]
    assert "maxk_offpolicy" in out and "[done] OK" in out, out[-3000:]
