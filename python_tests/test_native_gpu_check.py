"""bench/gpu_check.py runs blind on the GPU machine: CI drives the whole script on the CPU.

``--dry-run`` runs every section with the CPU kernel (tiny sizes, no build) and the Triton kernels
under the Triton interpreter; the CUDA-only sections (streams, graphs, compute-sanitizer) log why
they skipped, and the sanitizer target still runs plain.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bonkernels import _native

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not _native.available(), reason="native extension not built")
def test_gpu_check_dry_run_passes(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    log = (tmp_path / "gpu_check.log").read_text()
    assert summary["ok"] and summary["failed"] == 0 and "[done]" in log and "OK" in log.splitlines()[-1]
    sections = summary["sections"]
    for name in ("build", "kernels", "triton", "adversarial-native", "adversarial-triton", "api", "policy_loss"):
        assert sections[name]["passed"] > 0, (name, sections.get(name))
    for name in ("streams", "graphs", "sanitizer"):  # CUDA-only: skipped with a reason, never silently
        assert sections[name]["skipped"], (name, sections.get(name))
    assert "[sanitize-target] done" in log
    assert "extension build route:" in log
