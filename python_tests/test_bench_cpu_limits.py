"""bench/cpu_limits.py: the ratio arithmetic, the disturbed-row rule, and a --quick smoke run where
the native CPU kernel is built."""

import csv
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import cpu_limits as cl  # noqa: E402


def _native_available() -> bool:
    import torch

    import bonkernels as bk
    try:
        bk.advantages(torch.rand(2, 4), 2, "maxk_loo1", backend="cpu")
        return True
    except Exception:  # noqa: BLE001 - any failure means: not built here
        return False


def test_row_ratios():
    G, n = 4096, 16
    samples = G * n
    fastest = {"copy": 1e-5, "cpu": 5e-4, "torch": 3e-3}
    median = {"copy": 2e-5, "cpu": 6e-4, "torch": 3.6e-3}
    r = cl.row_for(G, n, "maxk_offpolicy", 1, fastest, median, 0.0, dram_copy_bps=30e9)
    assert r["cpu_ns_per_sample"] == pytest.approx(5e-4 / samples * 1e9)
    assert r["cpu_over_copy"] == pytest.approx(50) and r["torch_over_cpu"] == pytest.approx(6)
    assert r["cpu_over_copy_median"] == pytest.approx(30) and r["torch_over_cpu_median"] == pytest.approx(6)
    # off-policy moves 12 B per sample: the DRAM bound is 12 * samples / 30 GB/s
    assert r["bytes_per_sample_kernel"] == 12
    assert r["cpu_over_dram_copy_bound"] == pytest.approx(5e-4 / (12 * samples / 30e9))


def test_disturbed_rows_are_flagged():
    base = dict(G=64, n=1024, estimator="grpo", copy_ns_per_sample=0.1, cpu_ns_per_sample=5.0,
                torch_ns_per_sample=60.0)
    ok = dict(base, threads=2, copy_ns_per_sample=0.09, cpu_ns_per_sample=2.7, torch_ns_per_sample=34.0)
    slow_copy = dict(base, threads=2, estimator="grpo", copy_ns_per_sample=16.0, cpu_ns_per_sample=2.7,
                     torch_ns_per_sample=34.0)
    rows = [dict(base, threads=1), ok]
    cl.flag_disturbed(rows)
    assert [r["disturbed"] for r in rows] == [False, False]
    rows = [dict(base, threads=1), slow_copy]
    cl.flag_disturbed(rows)
    assert [r["disturbed"] for r in rows] == [False, True]


@pytest.mark.skipif(not _native_available(), reason="the native CPU extension is not built")
def test_quick_run(tmp_path):
    assert cl.main(["--quick", "--out", str(tmp_path), "--target-s", "0.02"]) == 0
    with open(tmp_path / "results.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["estimator"] == "maxk_loo1" and int(row["threads"]) == 1
    assert float(row["cpu_ns_per_sample"]) > 0 and float(row["torch_over_cpu"]) > 0
    assert float(row["max_abs_diff_cpu_vs_torch"]) < 1e-4
    assert (tmp_path / "REPORT.md").exists()
