"""Benchmark entry point: ``python -m bench`` or ``python bench/run.py``.

Modes:
  --quick     a few small cells, about a minute on 2 cores (smoke test; writes bench/results/quick)
  (default)   the recorded CPU run: target cells at 1 and 2 threads, then the sweep at 2 threads,
              within --budget-s (default 840 s); writes bench/results/cpu and rebuilds bench/RESULTS.md
  --gpu       the GPU run: every GPU backend against the torch reference and the n x n matrix on
              the GPU, within --budget-s (default 390 s; a hard stop 30 s later, so the whole
              command ends inside 8 minutes); builds nothing; writes bench/results/gpu (or --out)

Rows are appended to <out>/results.csv as they are measured, so an interrupted run keeps its data.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import environment, methods, report, sweep, timing  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)

CPU_SWEEP_ESTIMATORS = {"maxk_loo1": sweep.K_RULES, "maxk_offpolicy": sweep.K_RULES,
                        "maxk": ("4", "n/2"), "grpo": ("1",)}
QUICK_ESTIMATORS = {"maxk_loo1": ("4", "n/2"), "maxk_offpolicy": ("4", "n/2"), "grpo": ("1",)}


class BudgetExceeded(BaseException):
    """Raised by the alarm / SIGTERM handler; a BaseException so per-method error handling
    (``except Exception``) does not swallow it."""


def _alarm(_signum, _frame):
    raise BudgetExceeded()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small smoke run (about a minute)")
    ap.add_argument("--gpu", action="store_true", help="benchmark on cuda:0 (GPU backends)")
    ap.add_argument("--out", help="output folder (default bench/results/{quick,cpu,gpu})")
    ap.add_argument("--budget-s", type=float, help="time budget for the measurements")
    ap.add_argument("--threads", default=None, help="CPU thread counts for the target cells, e.g. 1,2")
    ap.add_argument("--sweep-threads", default=None, help="CPU thread counts for the sweep, e.g. 2")
    ap.add_argument("--methods", default="", help="comma-separated subset of methods to run")
    ap.add_argument("--max-call-s", type=float, help="skip sweep cells predicted slower than this per call")
    ap.add_argument("--target-s", type=float, help="time to spend on the repetitions of one method in one cell")
    ap.add_argument("--no-targets", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-results-md", action="store_true", help="do not rebuild bench/RESULTS.md")
    return ap.parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def build_config(a) -> tuple[sweep.Config, list[sweep.Cell]]:
    gpu = a.gpu
    device = torch.device("cuda:0" if gpu else "cpu")
    if gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: torch.cuda.is_available() is False on this machine")
    mode = "gpu" if gpu else ("quick" if a.quick else "cpu")
    out = a.out or os.path.join(BENCH_DIR, "results", mode)
    flt = tuple(m for m in a.methods.split(",") if m)
    if gpu:
        cfg = sweep.Config(device, out, a.budget_s or 390, max_call_s=0.5, target_max_call_s=5.0,
                           max_elems=1 << 27, matrix_max_n=2048, target_s=0.1, min_reps=10, methods_filter=flt)
        targets = sweep.target_cells([0], sweep.GPU_TARGETS)
        cells = sweep.sweep_cells([0], CPU_SWEEP_ESTIMATORS)
    elif a.quick:
        cfg = sweep.Config(device, out, a.budget_s or 90, max_call_s=0.5, target_max_call_s=3.0,
                           max_elems=1 << 17, matrix_max_n=1024, target_s=0.05, min_reps=3, slow_min_reps=1,
                           methods_filter=flt)
        targets = sweep.target_cells(_ints(a.threads or "2"), sweep.TARGETS[:2])
        cells = sweep.sweep_cells(_ints(a.sweep_threads or "2"), QUICK_ESTIMATORS, Gs=(64, 1024), ns=(8, 64, 1024))
    else:
        cfg = sweep.Config(device, out, a.budget_s or 840, max_call_s=1.5, target_max_call_s=20.0,
                           max_elems=1 << 23, matrix_max_n=1024, target_s=0.25, min_reps=5, methods_filter=flt)
        targets = sweep.target_cells(_ints(a.threads or "1,2"))
        cells = sweep.sweep_cells(_ints(a.sweep_threads or "2"), CPU_SWEEP_ESTIMATORS)
    if a.max_call_s:
        cfg.max_call_s = a.max_call_s
    if a.target_s:
        cfg.target_s = a.target_s
    cfg_cells = ([] if a.no_targets else targets) + ([] if a.no_sweep else cells)
    return cfg, cfg_cells, mode


def measure_copy_bandwidth(cfg: sweep.Config, cells: list[sweep.Cell]) -> dict[int, float]:
    if cfg.device.type == "cuda":
        return {0: timing.copy_bandwidth_cuda(cfg.device)}
    bw = {}
    for th in sorted({c.threads for c in cells}):
        torch.set_num_threads(th)
        bw[th] = timing.copy_bandwidth_cpu()
    return bw


def _write_env(out_dir: str, env: dict):
    with open(os.path.join(out_dir, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


def main(argv=None) -> int:
    a = parse_args(argv)
    cfg, cells, mode = build_config(a)
    os.makedirs(cfg.out_dir, exist_ok=True)
    if cfg.device.type == "cpu":
        timing.configure_malloc_for_timing()
    env = environment.describe(cfg.device, REPO_DIR)
    env.update(mode=mode, budget_s=cfg.budget_s, options=" ".join(sys.argv[1:] if argv is None else argv))
    print(f"[bench] mode={mode} device={cfg.device} out={cfg.out_dir} budget={cfg.budget_s:.0f}s "
          f"cells={len(cells)} load={env['load_average_start']}", flush=True)

    all_methods = methods.backend_methods(cfg.device) + methods.baseline_methods()
    if cfg.device.type == "cuda":  # per-sample / per-group Python loops are CPU-side (as in verl)
        for m in all_methods:
            if m.name in ("pkpo_listing", "verl_loop", "verl"):
                m.available, m.why_unavailable = False, "a Python loop per group/sample: measured in the CPU run"
    copy_bw = measure_copy_bandwidth(cfg, cells)
    runner = sweep.Runner(cfg, all_methods, copy_bw)
    for name, why in runner.unavailable.items():
        print(f"[bench] not run: {name}: {why}", flush=True)
    env.update(copy_GBps={str(k): v / 1e9 for k, v in copy_bw.items()}, unavailable=runner.unavailable)
    _write_env(cfg.out_dir, env)  # early, so a killed run can still be reported

    # A hard stop 30 s after the budget (counted from the start), or on SIGTERM (e.g. `timeout`):
    # rows already written stay in results.csv and the report is still written.
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, _alarm)
    signal.alarm(max(1, int(cfg.remaining_s() + 30)))
    t0 = time.perf_counter()
    try:
        for i, cell in enumerate(cells):
            runner.run_cell(cell)
            if i % 20 == 0 or cell.section == "target":
                print(f"[bench] {i + 1}/{len(cells)} {cell} {time.perf_counter() - t0:.0f}s", flush=True)
    except BudgetExceeded:
        print("[bench] stopped (hard time limit or SIGTERM): results so far are kept", flush=True)
    except KeyboardInterrupt:
        print("[bench] interrupted: results so far are kept", flush=True)
    finally:
        signal.alarm(0)

    env.update(elapsed_s=time.perf_counter() - cfg.started, load_average_end=environment.load_average())
    _write_env(cfg.out_dir, env)
    report_path = os.path.join(cfg.out_dir, "REPORT.md")
    with open(report_path, "w") as f:
        f.write(report.section_markdown(cfg.out_dir, cfg.out_dir, make_plots=not a.no_plots))
    print(f"[bench] wrote {runner.csv_path} and {report_path}", flush=True)
    default_dir = os.path.join(BENCH_DIR, "results", mode)
    if mode != "quick" and not a.no_results_md and os.path.abspath(cfg.out_dir) == default_dir:
        p = report.build_results_md(os.path.join(BENCH_DIR, "results"), os.path.join(BENCH_DIR, "RESULTS.md"),
                                    make_plots=not a.no_plots)
        print(f"[bench] rebuilt {p}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
