"""The benchmark's competitors compute what bk.advantages computes, so its speed-ups compare like with like.

1. Each baseline of bench/baselines.py against brute-force enumeration over all k-subsets
   (independent of the library).
2. Each method exactly as the benchmark calls it (bench/methods.py) against the torch reference
   backend on small inputs, for every estimator it is benchmarked on.
3. The harness end to end on a tiny grid: rows, skips, the report and its target table.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bonkernels as bk  # noqa: E402
from bench import baselines, methods, report, sweep  # noqa: E402


def brute(g, k, estimator, deltas=None):
    """Sum-scale weights by enumerating every k-subset: the definitions in spec 2.2, 2.4 and 3.2."""
    n = len(g)
    out = [0.0] * n
    for subset in itertools.combinations(range(n), k):
        top = max(g[t] for t in subset)
        for i in subset:
            if estimator == "maxk":
                out[i] += top
            elif estimator == "maxk_loo1":
                rest = [g[t] for t in subset if t != i]
                out[i] += top - max(rest)
            elif estimator == "maxk_offpolicy":
                out[i] += (1 + sum(deltas[t] for t in subset)) * top
    c = math.comb(n, k)
    return torch.tensor([v / c for v in out], dtype=torch.float64)


SIZES = [(n, k) for n in (1, 2, 3, 5, 7) for k in range(1, n + 1)]


@pytest.mark.parametrize("n,k", SIZES)
def test_listing_and_matrix_match_enumeration(n, k):
    gen = torch.Generator().manual_seed(100 * n + k)
    g = torch.rand(n, dtype=torch.float64, generator=gen)
    d = (torch.rand(n, dtype=torch.float64, generator=gen) - 0.5) * 0.2
    s = brute(g.tolist(), k, "maxk")
    torch.testing.assert_close(baselines.pkpo_s(g, k), s)
    torch.testing.assert_close(baselines.pkpo_s(g, k, cached=True), s)
    torch.testing.assert_close(baselines.maxk_matrix_onpolicy(g[None], k)[0], s)
    off = brute(g.tolist(), k, "maxk_offpolicy", d.tolist())
    torch.testing.assert_close(baselines.maxk_matrix_offpolicy(g[None], d[None], k)[0], off)
    if k >= 2:
        torch.testing.assert_close(baselines.pkpo_sloo_minus_one(g, k), brute(g.tolist(), k, "maxk_loo1"))


def test_matrix_offpolicy_chunks_and_clamp():
    """Chunking over groups and clamping the deltas change nothing but what they should."""
    gen = torch.Generator().manual_seed(3)
    r = torch.rand(7, 6, dtype=torch.float64, generator=gen)
    d = (torch.rand(7, 6, dtype=torch.float64, generator=gen) - 0.5)  # some |delta| > 0.2
    whole = baselines.maxk_matrix_offpolicy(r, d, 3, clamp_delta=0.2)
    chunked = baselines.maxk_matrix_offpolicy(r, d, 3, clamp_delta=0.2, max_chunk_elems=36 * 2)
    torch.testing.assert_close(whole, chunked)
    torch.testing.assert_close(whole, baselines.maxk_matrix_offpolicy(r, d.clamp(-0.2, 0.2), 3))


def test_matrix_large_n_does_not_overflow():
    """C(n, k) overflows float64 near n = 1030; the log-space ratio keeps the weights right."""
    r = torch.rand(1, 1500, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = bk.advantages(r, 750, "maxk", scale="sum", backend="torch")
    out = baselines.maxk_matrix_onpolicy(r, 750)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-12)


def test_verl_grpo_is_verl_semantics():
    """A singleton group gets mean 0 / std 1 as in verl (the library gives 0 there instead)."""
    scores = torch.tensor([1.0, 3.0, 5.0, 2.0])
    out = baselines.verl_grpo(scores, np.array([0, 0, 0, 1]))
    torch.testing.assert_close(out[:3], torch.tensor([-1.0, 0.0, 1.0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[3], torch.tensor(2.0 / (1 + 1e-6)))


CASES = [(est, n, rule) for est in ("maxk", "maxk_loo1", "maxk_offpolicy", "grpo")
         for n in (2, 3, 8, 16) for rule in (("1",) if est == "grpo" else sweep.K_RULES)]


@pytest.mark.parametrize("estimator,n,rule", CASES)
def test_benchmarked_methods_match_the_reference(estimator, n, rule):
    k = sweep.k_for(rule, n)
    inputs = methods.make_inputs(5, n, k, estimator, torch.device("cpu"), seed=n + k)
    ref = methods._backend_call("torch")(inputs)().reshape(-1).double()
    checked = 0
    for m in methods.baseline_methods() + methods.backend_methods(torch.device("cpu")):
        if estimator not in m.estimators or not m.available:
            continue
        out = m.build(inputs)().reshape(-1).double()
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-7, msg=f"{m.name} on {estimator}, n={n}, k={k}")
        checked += 1
    assert checked >= 2


def test_backend_probe_reports_why():
    ms = {m.name: m for m in methods.backend_methods(torch.device("cpu"))}
    assert ms["torch"].available
    assert not ms["triton"].available and "GPU" in ms["triton"].why_unavailable
    assert not ms["cuda"].available


def test_k_rules_are_distinct_and_valid():
    assert sweep.k_rules_for(4) == [("1", 1), ("4", 4), ("n/2", 2)]
    assert sweep.k_rules_for(8) == [("1", 1), ("4", 4), ("n", 8)]
    for n in sweep.SWEEP_N:
        ks = [k for _, k in sweep.k_rules_for(n)]
        assert len(ks) == len(set(ks)) and all(1 <= k <= n for k in ks)


def test_harness_end_to_end(tmp_path):
    """A tiny run: every row is written, the size cap skips, the report and target table render."""
    cfg = sweep.Config(torch.device("cpu"), str(tmp_path), budget_s=60, max_call_s=5, target_max_call_s=5,
                       max_elems=64, matrix_max_n=8, target_s=0.002, min_reps=2, slow_min_reps=1)
    all_methods = methods.backend_methods(cfg.device) + methods.baseline_methods()
    runner = sweep.Runner(cfg, all_methods, {1: 1e10})
    cells = [sweep.Cell("target", 1, "maxk_loo1", 8, 4, "4", 4),
             sweep.Cell("sweep", 1, "maxk_offpolicy", 4, 16, "n/2", 8),   # 64 elements: measured
             sweep.Cell("sweep", 1, "maxk_offpolicy", 8, 16, "n/2", 8)]   # 128 > cap: skipped
    for c in cells:
        runner.run_cell(c)
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    by = {(r["section"], r["G"], r["method"]): r for r in rows}
    assert by[("target", "8", "torch")]["status"] == "ok"
    assert float(by[("target", "8", "pkpo_listing")]["max_rel_err"]) < 1e-6
    assert by[("sweep", "4", "torch")]["status"] == "ok"
    assert by[("sweep", "4", "maxk_matrix")]["status"] == "skipped"  # n = 16 above matrix_max_n
    assert all(r["status"] == "skipped" for r in rows if r["G"] == "8" and r["section"] == "sweep")
    assert all(r["status"] != "error" for r in rows), [r["note"] for r in rows if r["status"] == "error"]
    text = report.section_markdown(str(tmp_path), str(tmp_path), make_plots=False)
    assert "### Targets" in text and "maxk_offpolicy" in text


def test_target_cells_run_backends_and_the_slower_method():
    cells = sweep.target_cells([1, 2])
    assert all(set(sweep.M.BACKENDS) <= set(c.methods) for c in cells)
    loop = [c for c in cells if c.estimator == "maxk_loo1" and c.G == 16384]
    assert [c.threads for c in loop] == [2] and "verl_loop" in loop[0].methods  # Python loop: 2 threads only
    matrix = [c for c in cells if c.n == 1024]
    assert {c.threads for c in matrix} == {1, 2} and all("maxk_matrix" in c.methods for c in matrix)
    assert all("pkpo_listing" not in c.methods for c in cells)


def _row(**kw):
    base = dict(section="target", device="cpu", threads=1, estimator="maxk_loo1", G=4096, n=16, k=4,
                k_rule="4", method="torch", kind="backend", status="ok", note="", median_ms=1.0, min_ms=1.0)
    base.update(kw)
    return base


def test_target_table_says_met_or_missed():
    rows = [_row(method="torch", median_ms=4.0, min_ms=3.0), _row(method="cpu", median_ms=1.0, min_ms=1.0),
            _row(threads=2, method="torch", median_ms=6.0, min_ms=6.0),
            _row(threads=2, method="cpu", median_ms=1.0, min_ms=1.0)]
    table = report.target_table(rows, gpu=False).splitlines()
    first = next(line for line in table if line.startswith("| cpu kernel vs torch reference, G=4096 n=16 | 1 "))
    second = next(line for line in table if line.startswith("| cpu kernel vs torch reference, G=4096 n=16 | 2 "))
    assert "4x" in first and "**no**" in first      # 4x < 5x
    assert "6x" in second and "| yes |" in second
    assert any("not run" in line for line in table)  # targets without rows say so


def test_verl_loop_equals_installed_verl():
    """The copied loop is verl's: same values as verl's own function where verl is installed."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    gen = torch.Generator().manual_seed(5)
    scores = torch.rand(24, generator=gen)
    index = np.array([0, 1, 2] * 6 + [3] * 5 + [4])  # groups of 6, 5 and a singleton
    theirs = core_algos.compute_grpo_outcome_advantage(scores[:, None], torch.ones(24, 1), index)[0][:, 0]
    torch.testing.assert_close(baselines.verl_grpo(scores, index), theirs, rtol=0, atol=0)
