"""bench/gpu_check.py runs blind on the GPU machine: CI drives the whole script on the CPU.

``--dry-run`` runs every section with the CPU kernel (tiny sizes, no build) and the Triton kernels
under the Triton interpreter; the CUDA-only sections (streams, graphs, compute-sanitizer) log why
they skipped, and the sanitizer target still runs plain. One run serves both tests.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bonkernels import _native

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not _native.available(), reason="native extension not built")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("gpu_check")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    summary = json.loads((out_dir / "summary.json").read_text())
    log = (out_dir / "gpu_check.log").read_text()
    return proc, summary, log


def test_dry_run_exercises_every_section(dry_run):
    proc, summary, log = dry_run
    sections = summary["sections"]
    for name in ("build", "kernels", "triton", "adversarial-native", "adversarial-triton", "api", "policy_loss"):
        assert sections[name]["passed"] > 0, (name, sections.get(name), proc.stdout[-3000:])
    for name in ("streams", "graphs", "sanitizer"):  # CUDA-only: skipped with a reason, never silently
        assert sections[name]["skipped"], (name, sections.get(name))
    assert "[sanitize-target] done" in log and "extension build route:" in log
    # the Triton sections run in shards (child processes) whose counts merge into one section
    for job in ("triton-0", "triton-1", "adversarial-triton-0", "adversarial-triton-1"):
        assert f"---------------- {job} (exit 0)" in log, job
    assert "[done]" in log.splitlines()[-1]
    assert (proc.returncode == 0) == summary["ok"]  # the exit status is the summary's verdict


def test_dry_run_passes(dry_run):
    proc, summary, log = dry_run
    failing = {name: s["failed"][:3] for name, s in summary["sections"].items() if s["failed"]}
    assert proc.returncode == 0 and summary["ok"], (failing, summary["failures_outside_sections"])


def test_triton_cache_fill_compiles_what_the_triton_section_launches():
    """On a GPU the check compiles the Triton sections' kernels ahead, beside the build: every
    estimator's at float32 and TRITON_EVERY_DTYPE's at the other dtypes, both layouts, every
    block, for the device's arch."""
    from bench import gpu_check
    from bonkernels.triton import _config, _facts, aot

    specs = []
    for command in gpu_check.triton_cache_fill_commands(90):
        assert command[:3] == [sys.executable, "-m", "bonkernels.triton.aot"]
        args = aot.parse_args(command[3:])
        assert args.arch == [90] and args.estimators
        specs += aot.selected(args)
    covered = {(_facts.by_code(s.constants.code).name, s.dtype_name, s.config.block, s.config.lanes) for s in specs}
    wanted = [(e.name, "fp32") for e in _facts.kernel_estimators()]
    wanted += [(name, dtype) for name in gpu_check.TRITON_EVERY_DTYPE for dtype in ("fp64", "fp16", "bf16")]
    for name, dtype in wanted:
        for block in _config.all_blocks():
            assert (name, dtype, block, False) in covered, (name, dtype, block)
        assert (name, dtype, 8, True) in covered, (name, dtype)
    assert len(specs) == len(set(specs))


def test_triton_cache_fill_is_stopped_when_the_check_ends():
    """A fill still running when the check finishes is ended (its whole process group)."""
    from bench import gpu_check

    process = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    gpu_check.stop_triton_cache_fill(process)
    assert process.poll() is not None
    gpu_check.stop_triton_cache_fill(None)
