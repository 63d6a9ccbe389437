"""Cost of a mixture over k (k_weights, docs/spec.md section 12) against a single k, same run.

A mixture only changes the weight tables (built once per (estimator, n, w) and cached), so the
per-sample cost should match a single k. This times, per cell, ``bk.advantages`` with
``k_weights = harmonic:n`` (T = n, every k weighted; n - 1 for the leave-one-out estimators that
need it) and with a single k = n/2, on the same full ``[G, n]`` float32 rewards, and reports the
ratio. The first mixture call (table build, cold cache) is reported separately.

    python -m bench.mixtures                     # cpu kernel; G = 4096 at n = 16, G = 256 at n = 1024
    python -m bench.mixtures --quick             # small smoke cells
    python -m bench.mixtures --backend torch     # the reference

A backend that does not take the table bank yet falls back to the reference for the mixture
(``backend="auto"`` rules); the report says so in the ``mixture_backend`` column.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import torch

import bonkernels as bk
from bonkernels import backends, estimators, tables

from .timing import time_cpu

CELLS = ((4096, 16), (256, 1024))
QUICK_CELLS = ((256, 16), (16, 1024))
ESTIMATORS = ("maxk_loo1", "maxk")


def _mixture_backend(backend: str, rewards: torch.Tensor, estimator: str) -> str:
    row = backends.select(backend, rewards.reshape(-1), estimators.get(estimator), rewards.shape[1])
    return backend if row.takes_bank else "torch"


def run_cell(G: int, n: int, estimator: str, backend: str, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(G, n, generator=gen, dtype=torch.float32)
    T = n - estimators.get(estimator).k_margin
    weights = bk.maxrl_weights(T)
    k = max(1, n // 2)
    mix_backend = _mixture_backend(backend, rewards, estimator)
    common = dict(scale="mean", check_inputs=False, max_group_size=n)

    def single():
        return bk.advantages(rewards, k, estimator, backend=backend, **common)

    def mixture():
        return bk.advantages(rewards, estimator=estimator, k_weights=weights, backend=mix_backend, **common)

    tables.clear_cache()
    t0 = time.perf_counter()
    mixture()
    cold = time.perf_counter() - t0
    t_single = time_cpu(single, target_s=0.5)
    t_mix = time_cpu(mixture, target_s=0.5)
    return {"G": G, "n": n, "estimator": estimator, "backend": backend, "mixture_backend": mix_backend,
            "T": T, "single_k": k, "single_s": t_single.median_s, "mixture_s": t_mix.median_s,
            "ratio": t_mix.median_s / t_single.median_s, "mixture_first_call_s": cold,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mixtures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="cpu", help="cpu (default), torch, auto, ...")
    p.add_argument("--quick", action="store_true", help="small smoke cells")
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--out", default=None, help="CSV file for the rows")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print("| G | n | estimator | single k | T | mixture backend | single (ms) | mixture (ms) | ratio | "
          "first mixture call (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for G, n in (QUICK_CELLS if args.quick else CELLS):
        for estimator in args.estimators.split(","):
            row = run_cell(G, n, estimator, args.backend)
            rows.append(row)
            print(f"| {G} | {n} | {estimator} | {row['single_k']} | {row['T']} | {row['mixture_backend']} | "
                  f"{1e3 * row['single_s']:.3f} | {1e3 * row['mixture_s']:.3f} | {row['ratio']:.2f} | "
                  f"{1e3 * row['mixture_first_call_s']:.1f} |", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
