"""CPU distance from the limits, side by side in one run: the C++ kernel (backend="cpu") against the
PyTorch reference (backend="torch") and against a memory copy of the same rewards
(``out.copy_(rewards)``), at 1 and 2 threads.

    python -m bench.cpu_limits                  # writes bench/results/cpu_limits/
    python -m bench.cpu_limits --quick --out D  # one small cell (smoke run)

Cells: G = 4096 n = 16, G = 64 n = 1024, G = 16 n = 4096 (G n = 65,536 samples each), float32
[G, n] rewards ~ U(0, 1), deltas ~ U(-0.1, 0.1) with clamp_delta = 0.2 (off-policy), k = 4,
``check_inputs=False, max_group_size=n``; estimators maxk_loo1, maxk_offpolicy, grpo.
Each (cell, threads) is measured in ``--rounds`` rounds (passes over the whole plan, so a cell's
rounds lie far apart in time), each round timing the copy, the kernel and the reference back to
back (bench/timing.py's time_cpu). A method's time is its fastest single call
over all rounds (on a machine shared with other processes the statistic least hurt by preemption);
the smallest round median is reported beside it. Reported: ns per sample, kernel / copy (the copy
moves the rewards' bytes, 8 B per sample read + written, and at these sizes they stay in cache; the
off-policy kernel also reads the deltas, 12 B), kernel / DRAM-copy bound (the kernel's bytes at the
bandwidth of a 256 MiB copy measured in the same run: the figure bench/RESULTS.md calls
x copy-bound) and reference / kernel.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import environment, timing  # noqa: E402
from bench.methods import CLAMP_DELTA, ESTIMATOR_SCALE  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
CELLS = ((4096, 16), (64, 1024), (16, 4096))
ESTIMATORS = ("maxk_loo1", "maxk_offpolicy", "grpo")
K = 4


def calls(G: int, n: int, estimator: str, seed: int = 0):
    """(copy, kernel, reference) callables on the same inputs."""
    import bonkernels as bk

    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(G, n, generator=g)
    kwargs = dict(scale=ESTIMATOR_SCALE.get(estimator, "mean"), check_inputs=False, max_group_size=n)
    if estimator == "maxk_offpolicy":
        kwargs.update(deltas=(torch.rand(G, n, generator=g) - 0.5) * 0.2, clamp_delta=CLAMP_DELTA)
    k = None if estimator == "grpo" else K
    out = torch.empty_like(rewards)

    def copy():
        return out.copy_(rewards)

    def kernel():
        return bk.advantages(rewards, k, estimator, backend="cpu", **kwargs)

    def reference():
        return bk.advantages(rewards, k, estimator, backend="torch", **kwargs)

    return copy, kernel, reference


def time_round(fns: dict, threads: int, target_s: float, fastest: dict, median: dict) -> None:
    """One round of one cell: each method timed back to back; keeps each method's fastest call and
    smallest median so far."""
    torch.set_num_threads(threads)
    for name, fn in fns.items():
        t = timing.time_cpu(fn, target_s=target_s, min_reps=5, max_reps=5000, probe_memory_below_s=0.0)
        fastest[name] = min(fastest.get(name, float("inf")), t.min_s)
        median[name] = min(median.get(name, float("inf")), t.median_s)


def row_for(G: int, n: int, estimator: str, threads: int, fastest: dict, median: dict, err: float,
            dram_copy_bps: float | None = None) -> dict:
    samples = G * n
    kernel_bytes = (12 if estimator == "maxk_offpolicy" else 8) * samples
    row = {"G": G, "n": n, "estimator": estimator, "threads": threads}
    for name in ("copy", "cpu", "torch"):
        row[f"{name}_ns_per_sample"] = fastest[name] / samples * 1e9
    row.update(cpu_over_copy=fastest["cpu"] / fastest["copy"], torch_over_cpu=fastest["torch"] / fastest["cpu"])
    for name in ("copy", "cpu", "torch"):
        row[f"{name}_median_ns_per_sample"] = median[name] / samples * 1e9
    row.update(cpu_over_copy_median=median["cpu"] / median["copy"],
               torch_over_cpu_median=median["torch"] / median["cpu"])
    if dram_copy_bps:
        row["dram_copy_GBps"] = dram_copy_bps / 1e9
        row["cpu_over_dram_copy_bound"] = fastest["cpu"] / (kernel_bytes / dram_copy_bps)
    row.update(bytes_per_sample_kernel=kernel_bytes // samples, bytes_per_sample_copy=8,
               max_abs_diff_cpu_vs_torch=err)
    return row


def flag_disturbed(rows: list[dict], slack: float = 1.5) -> None:
    """Mark a row measured with more threads as disturbed when any of its methods ran more than
    ``slack`` x slower than with 1 thread in the same cell: on a machine shared with other
    processes a multi-threaded call waits for a preempted thread at every barrier, and the fastest
    call of all the rounds can still carry that wait. Such rows' ratios are not figures of the code."""
    one = {(r["G"], r["n"], r["estimator"]): r for r in rows if r["threads"] == 1}
    for r in rows:
        base = one.get((r["G"], r["n"], r["estimator"]))
        r["disturbed"] = bool(base is not None and r["threads"] > 1 and any(
            r[f"{m}_ns_per_sample"] > slack * base[f"{m}_ns_per_sample"] for m in ("copy", "cpu", "torch")))


def markdown(rows: list[dict]) -> str:
    head = ("| G | n | estimator | threads | copy ns/sample | cpu kernel ns/sample | torch ref ns/sample | "
            "kernel / copy | ref / kernel | kernel / DRAM-copy bound | (medians) kernel / copy | "
            "(medians) ref / kernel | ref >= 10x kernel | kernel within 10x of copy | disturbed |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        dram = f"{r['cpu_over_dram_copy_bound']:.1f}x" if "cpu_over_dram_copy_bound" in r else "-"
        lines.append(f"| {r['G']} | {r['n']} | {r['estimator']} | {r['threads']} | {r['copy_ns_per_sample']:.2f} | "
                     f"{r['cpu_ns_per_sample']:.2f} | {r['torch_ns_per_sample']:.2f} | {r['cpu_over_copy']:.1f}x | "
                     f"{r['torch_over_cpu']:.1f}x | {dram} | {r['cpu_over_copy_median']:.1f}x | "
                     f"{r['torch_over_cpu_median']:.1f}x | {'yes' if r['torch_over_cpu'] >= 10 else 'no'} | "
                     f"{'yes' if r['cpu_over_copy'] <= 10 else 'no'} | "
                     f"{'DISTURBED' if r.get('disturbed') else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "results", "cpu_limits"))
    ap.add_argument("--quick", action="store_true", help="G = 256 n = 16, maxk_loo1, 1 thread, 1 round")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target-s", type=float, default=0.1, help="time per method per round")
    a = ap.parse_args(argv)
    timing.configure_malloc_for_timing()
    os.makedirs(a.out, exist_ok=True)
    env = environment.describe(torch.device("cpu"), REPO_DIR)
    env["options"] = " ".join(sys.argv[1:] if argv is None else argv)
    if a.quick:
        plan = [(256, 16, "maxk_loo1", 1)]
        rounds = 1
    else:
        threads = [int(t) for t in a.threads.split(",")]
        plan = [(G, n, est, th) for (G, n) in CELLS for est in ESTIMATORS for th in threads]
        rounds = a.rounds
    rows, t0 = [], time.perf_counter()
    dram = {}
    for th in sorted({p[3] for p in plan}):
        torch.set_num_threads(th)
        dram[th] = timing.copy_bandwidth_cpu(64 << 20 if a.quick else 256 << 20)
    env["dram_copy_GBps"] = {str(k): v / 1e9 for k, v in dram.items()}
    # Rounds are passes over the whole plan, so a cell's rounds lie far apart in time and a burst of
    # load from other processes spoils at most some of them.
    cells = []
    for G, n, est, th in plan:
        copy, kernel, reference = calls(G, n, est)
        torch.set_num_threads(th)
        err = (kernel() - reference()).abs().max().item()
        cells.append(((G, n, est, th), {"copy": copy, "cpu": kernel, "torch": reference}, {}, {}, err))
    for r in range(rounds):
        for (G, n, est, th), fns, fastest, median, _ in cells:
            time_round(fns, th, a.target_s, fastest, median)
        print(f"[cpu_limits] round {r + 1}/{rounds} ({time.perf_counter() - t0:.0f} s, load "
              f"{environment.load_average()})", flush=True)
    for (G, n, est, th), _, fastest, median, err in cells:
        r = row_for(G, n, est, th, fastest, median, err, dram[th])
        rows.append(r)
    flag_disturbed(rows)
    env.update(elapsed_s=time.perf_counter() - t0, load_average_end=environment.load_average())
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    md = [f"# CPU distance from the limits ({env.get('date_utc', '?')})", "",
          f"`python -m bench.cpu_limits {env['options']}`; {env.get('host_cpu', '?')}, "
          f"{env.get('logical_cpus', '?')} logical CPUs, torch {env.get('torch', '?')}, bonkernels "
          f"{env.get('bonkernels_commit', '?')}; load average at start {env.get('load_average_start', '?')}, "
          f"at end {env['load_average_end']}; {rounds} round(s). Times: the fastest single call of each "
          f"method over all rounds (the statistic least hurt by other processes on a loaded machine); "
          f"the medians columns use each method's smallest round median. The copy is `out.copy_(rewards)` "
          f"(8 B per sample, cache-resident at these sizes); the DRAM-copy bound is the kernel's bytes at "
          f"the bandwidth of a 256 MiB copy measured in this run ("
          + ", ".join(f"{v:.1f} GB/s at {k} thread(s)" for k, v in env["dram_copy_GBps"].items()) + ").", "",
          markdown(rows), ""]
    path = os.path.join(a.out, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(markdown(rows))
    print(f"[cpu_limits] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
