"""bench/gpu_limits.py: the verdicts against the issue's targets, and the whole flow on the CPU
kernel (--dry-run), so the script a GPU session runs is exercised in CI."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import gpu_limits as gl  # noqa: E402


def test_verdicts_apply_the_targets():
    bandwidth = [{"backend": "cuda", "estimator": "maxk_loo1", "G": 1 << 20, "n": 16, "fraction_of_copy": 0.72},
                 {"backend": "triton", "estimator": "maxk_loo1", "G": 1 << 20, "n": 16, "fraction_of_copy": 0.45},
                 {"backend": "cuda", "estimator": "maxk_loo1", "G": 1 << 18, "n": 64, "fraction_of_copy": 0.1}]
    small = [{"backend": "cuda", "estimator": "grpo", "G": 1024, "n": 16, "kernel_us": 4.0, "wall_us": 16.0},
             {"backend": "cuda", "estimator": "maxk", "G": 1024, "n": 16, "kernel_us": 3.0, "wall_us": 9.0},
             {"backend": "plan:cuda", "estimator": "grpo", "G": 1024, "n": 16, "kernel_us": 4.0, "wall_us": 12.0},
             {"backend": "triton-spread", "estimator": "grpo", "G": 1024, "n": 16, "kernel_us": 4.0,
              "wall_us": 12.0}]
    lines = gl.verdicts(bandwidth, small)
    assert len(lines) == 5                                # the n = 64 and the A/B rows have no target
    assert lines[4].startswith("plan:cuda") and lines[4].endswith(": met")  # a prepared call, checks off
    assert lines[0].endswith(": met") and "72%" in lines[0]
    assert lines[1].endswith("NOT met")                   # triton below 50 %
    assert lines[2].endswith("NOT met")                   # wall 16 us >= 15 us
    assert lines[3].endswith(": met")


def test_dry_run_measures_every_cell(tmp_path):
    assert gl.main(["--dry-run", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_limits.json").read_text())
    cells = {(r["estimator"], r["n"]) for r in data["bandwidth"]}
    assert cells == {(e, n) for e in gl.ESTIMATORS for n in (8, 16, 64)}
    assert all(r["time_us"] > 0 and 0 < r["fraction_of_copy"] for r in data["bandwidth"])
    # every estimator, and one torch op as the floor of a call from Python
    assert {r["estimator"] for r in data["small_batch"]} == set(gl.ESTIMATORS) | {"copy_ (one launch)"}
    assert [r["backend"] for r in data["small_batch"]].count("torch") == 1
    # each backend's call prepared once beside it (bk.prepare_advantages)
    assert {r["estimator"] for r in data["small_batch"] if r["backend"] == "plan:cpu"} == set(gl.ESTIMATORS)
    assert all(r["wall_us"] > 0 and r["kernel_us"] is None for r in data["small_batch"])  # no GPU: no profiler
    assert (tmp_path / "REPORT.md").read_text().startswith("# GPU limits")


def test_cells_can_be_narrowed(tmp_path):
    # an A/B run of two builds times only the cells it compares
    assert gl.main(["--dry-run", "--backends", "cpu", "--ns", "8", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_limits.json").read_text())
    assert {(r["backend"], r["n"]) for r in data["bandwidth"]} == {("cpu", 8)}


def test_spread_layout_switches_the_triton_launch_and_restores_it():
    """The A/B cell triton-spread: inside the context every block launches the layout with a group
    spread over many threads; outside, the blocks up to LANE_MAX_BLOCK are lanes again (and up to
    OWN_KERNEL_LANE_MAX_BLOCK for a launch that runs its estimator's own kernel)."""
    from bonkernels.triton import _config

    small, top = _config.LANE_MAX_BLOCK, _config.OWN_KERNEL_LANE_MAX_BLOCK
    assert _config.config_for_block(small).lanes
    with gl.spread_layout():
        own = _config.takes_own_kernel_lanes(True, torch.float32)
        assert not any(_config.config_for_block(b, False, own_kernel=own).lanes for b in _config.all_blocks())
    assert _config.config_for_block(small).lanes and _config.LANE_MAX_BLOCK == small
    assert _config.config_for_block(top, False, own_kernel=_config.takes_own_kernel_lanes(True, torch.float32)).lanes


def test_generic_kernel_takes_the_blocks_of_the_estimators_own_kernels():
    """The A/B cell triton-generic: the kernel with every estimator in the layouts the estimator's
    own kernel would take (lanes at block 32 on-policy included), so the two differ by the kernel
    alone."""
    from bonkernels.triton import _config

    with gl.generic_kernel():
        assert not _config.SPECIALISED_KERNELS
        own = _config.takes_own_kernel_lanes(False, torch.float32)
        assert _config.config_for_block(_config.OWN_KERNEL_LANE_MAX_BLOCK, False, own_kernel=own).lanes
    assert _config.SPECIALISED_KERNELS and _config.OWN_KERNEL_LANES is None
    # (the table's [G, n] calls read one k's bank: maxk_offpolicy's own kernel goes a column at a time)
    assert gl._lane_max_block("maxk_offpolicy") == _config.OWN_KERNEL_LANE_MAX_BLOCK == 32
    assert gl._lane_max_block("maxk_loo1") == _config.SERIAL_LANE_MAX_BLOCK == 64
    assert gl._lane_max_block("grpo") == _config.CENTRED_LANE_MAX_BLOCK  # a centred estimator
    assert gl._generic_lane_max_block() == _config.OWN_KERNEL_LANE_MAX_BLOCK


def test_small_batch_times_the_generic_kernel_beside_triton(monkeypatch):
    """At G = 1024 a Triton launch spreads each group over threads: triton-spread would time
    triton again, and triton-generic is the A/B of the spread kernel compiled per estimator."""
    made = []
    monkeypatch.setattr(gl, "make_call", lambda backend, est, G, n, device: (made.append(backend) or (lambda: None), 0))
    rows = gl.small_batch_rows(("cuda", "triton", gl.SPREAD, gl.GENERIC), gl.Clock("cpu"), "cpu", 4, 16, 1,
                               lambda line: None)
    timed = {r["backend"] for r in rows}
    assert timed == {"torch", "cuda", "triton", gl.GENERIC, "plan:cuda", "plan:triton"}
    assert set(made) == timed - {"torch"}


def test_generic_cells_time_both_layouts_but_lanes_no_launch_takes():
    """triton-generic is timed wherever triton runs its own kernel, in lanes or spread, except
    grpo and maxk_loo1 at 64, where the kernel with every estimator would take lanes no launch
    takes; triton-spread only where triton takes lanes."""
    runs = gl.bandwidth_cell_runs
    for n in gl.NS:
        assert runs("triton", "maxk_loo1", n) and runs("cuda", "grpo", n)
        assert runs(gl.GENERIC, "maxk_offpolicy", n)
        assert runs(gl.GENERIC, "maxk_loo1", n) == runs(gl.GENERIC, "grpo", n) == (n != 64)
        assert runs(gl.SPREAD, "maxk_offpolicy", n) == (n <= 32)
        assert runs(gl.SPREAD, "maxk_loo1", n) == runs(gl.SPREAD, "grpo", n) == (n <= 64)
