"""The benchmark grid and the loop that runs it: cells, skip rules, rows written as they come.

A cell is (threads, estimator, G, n, k); every available method that supports the estimator runs
on the same inputs in the same cell, so the ratios in one row group are side by side. Cells that
would take too long are skipped with the reason recorded: a size cap (memory), a per-call time cap
predicted from the same method's smaller cells in this run, and the overall time budget.
"""

from __future__ import annotations

import csv
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from bench import methods as M
from bench import timing

SWEEP_G = (64, 1024, 16384, 131072)
SWEEP_N = (4, 8, 16, 64, 256, 1024, 4096)
K_RULES = ("1", "4", "n/2", "n")


def k_for(rule: str, n: int) -> int:
    return {"1": 1, "4": min(4, n), "n/2": max(1, n // 2), "n": n}[rule]


def k_rules_for(n: int, rules=K_RULES) -> list[tuple[str, int]]:
    """Distinct k values of the rules for this n (the first rule naming a k wins its label)."""
    seen, out = set(), []
    for r in rules:
        k = k_for(r, n)
        if k not in seen:
            seen.add(k)
            out.append((r, k))
    return out


@dataclass(frozen=True)
class Cell:
    section: str        # "target" or "sweep"
    threads: int
    estimator: str
    G: int
    n: int
    k_rule: str
    k: int
    methods: tuple[str, ...] = ()   # empty: every method that supports the estimator


@dataclass
class Row:
    section: str
    device: str
    threads: int
    estimator: str
    G: int
    n: int
    k: int
    k_rule: str
    method: str
    kind: str
    status: str                  # ok | skipped | error
    note: str = ""
    median_ms: float = math.nan
    min_ms: float = math.nan
    max_ms: float = math.nan
    first_call_ms: float = math.nan
    reps: int = 0
    samples_per_s: float = math.nan
    peak_mem_bytes: float = math.nan
    bytes_moved: int = 0
    eff_GBps: float = math.nan
    copy_GBps: float = math.nan
    x_copy_bound: float = math.nan   # median time / (bytes_moved / copy bandwidth)
    max_rel_err: float = math.nan    # vs the torch reference backend in the same cell


ROW_FIELDS = list(Row.__dataclass_fields__)


@dataclass
class Config:
    device: torch.device
    out_dir: str
    budget_s: float
    max_call_s: float              # sweep cells predicted slower than this are skipped
    target_max_call_s: float       # same for the target cells (they matter more)
    max_elems: int                 # G * n cap (memory): larger sweep cells are skipped
    matrix_max_n: int              # the O(n^2) matrix baseline is skipped above this n
    target_s: float = 0.25
    min_reps: int = 5
    slow_min_reps: int = 3         # repetitions of calls slower than 0.5 s
    methods_filter: tuple[str, ...] = ()
    started: float = field(default_factory=time.perf_counter)

    def remaining_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)


class Runner:
    """Runs cells, predicts and skips the hopeless ones, appends every row to results.csv."""

    def __init__(self, cfg: Config, all_methods: list[M.Method], copy_bw: dict[int, float]):
        self.cfg = cfg
        chosen = [m for m in all_methods if not cfg.methods_filter or m.name in cfg.methods_filter]
        self.methods = [m for m in chosen if m.available]
        self.unavailable = {m.name: m.why_unavailable for m in chosen if not m.available}
        self.copy_bw = copy_bw          # threads (0 on GPU) -> bytes/s
        self.history: dict[tuple, list[tuple[int, int, float]]] = {}
        self.rows: list[Row] = []
        os.makedirs(cfg.out_dir, exist_ok=True)
        self.csv_path = os.path.join(cfg.out_dir, "results.csv")
        with open(self.csv_path, "w", newline="") as f:
            csv.writer(f).writerow(ROW_FIELDS)
        self.gpu = cfg.device.type == "cuda"
        self.cuda_timer = timing.CudaTimer(cfg.device) if self.gpu else None

    # ------------------------------------------------------------------ bookkeeping
    def _emit(self, row: Row):
        self.rows.append(row)
        with open(self.csv_path, "a", newline="") as f:
            csv.writer(f).writerow([getattr(row, k) for k in ROW_FIELDS])

    def _row(self, cell: Cell, m: M.Method, status: str, note: str = "") -> Row:
        return Row(cell.section, self.cfg.device.type, cell.threads, cell.estimator, cell.G, cell.n,
                   cell.k, cell.k_rule, m.name, m.kind, status, note)

    def _predict_s(self, cell: Cell, m: M.Method) -> float | None:
        """Time predicted from this method's largest smaller cell: t * (G n) / (G' n') * (n/n')^(p-1)."""
        best = None
        for G0, n0, t0 in self.history.get((m.name, cell.estimator, cell.k_rule, cell.threads), []):
            if G0 <= cell.G and n0 <= cell.n and (best is None or G0 * n0 > best[0] * best[1]):
                best = (G0, n0, t0)
        if best is None:
            return None
        G0, n0, t0 = best
        return t0 * (cell.G * cell.n) / (G0 * n0) * (cell.n / n0) ** (m.cost_exponent - 1.0)

    def _skip_reason(self, cell: Cell, m: M.Method) -> str:
        cfg = self.cfg
        if cell.section == "sweep" and cell.G * cell.n > cfg.max_elems:
            return f"G*n = {cell.G * cell.n:,} above the size cap {cfg.max_elems:,} (memory/time)"
        if m.name == "maxk_matrix" and cell.n > cfg.matrix_max_n:
            return f"n x n matrix at n = {cell.n} above n = {cfg.matrix_max_n} (O(n^2) memory and time)"
        cap = cfg.target_max_call_s if cell.section == "target" else cfg.max_call_s
        pred = self._predict_s(cell, m)
        if pred is not None and pred > cap:
            return f"predicted {pred:.1f} s per call (from smaller cells) above the {cap:g} s cap"
        # A timed cell costs about 2 warm-ups + 3 repetitions + 1 memory probe for slow calls.
        if pred is not None and 6 * pred > cfg.remaining_s():
            return "time budget of this run exhausted"
        if cfg.remaining_s() <= 0:
            return "time budget of this run exhausted"
        return ""

    # ------------------------------------------------------------------ one cell
    def run_cell(self, cell: Cell):
        if not self.gpu:
            torch.set_num_threads(max(1, cell.threads))
        todo = [m for m in self.methods if cell.estimator in m.estimators
                and (not cell.methods or m.name in cell.methods)]
        if not todo:
            return
        inputs = None
        ref_out = None
        for m in todo:
            why = self._skip_reason(cell, m)
            if why:
                self._emit(self._row(cell, m, "skipped", why))
                continue
            if inputs is None:
                inputs = M.make_inputs(cell.G, cell.n, cell.k, cell.estimator, self.cfg.device)
            row = self._row(cell, m, "ok")
            try:
                fn = m.build(inputs)
                out = fn()
                out = out.reshape(-1).double()  # baselines return the packed [N] layout
                if ref_out is None and m.kind == "backend":  # torch, or the first backend measured
                    ref_out = out
                elif ref_out is not None:
                    diff = (out - ref_out).abs().max().item()
                    row.max_rel_err = diff / max(ref_out.abs().max().item(), 1e-30)
                del out
                self._measure(row, fn, inputs, cell)
            except Exception as e:  # a failing method must not end the run: record it
                row.status, row.note = "error", f"{type(e).__name__}: {str(e)[:200]}"
            self._emit(row)
            if row.status == "ok":
                self.history.setdefault((m.name, cell.estimator, cell.k_rule, cell.threads), []).append(
                    (cell.G, cell.n, row.min_ms / 1e3))  # min: robust to a loaded machine

    def _measure(self, row: Row, fn, inputs: M.CellInputs, cell: Cell):
        cfg = self.cfg
        if self.gpu:
            t = self.cuda_timer.time(fn, target_s=cfg.target_s)
            row.peak_mem_bytes = timing.peak_cuda_bytes(fn, cfg.device)
            bw = self.copy_bw.get(0, math.nan)
        else:
            t = timing.time_cpu(fn, target_s=cfg.target_s, min_reps=cfg.min_reps,
                                slow_min_reps=cfg.slow_min_reps)
            row.peak_mem_bytes = math.nan if t.peak_mem_bytes is None else t.peak_mem_bytes
            bw = self.copy_bw.get(cell.threads, math.nan)
        row.median_ms, row.min_ms, row.max_ms = t.median_s * 1e3, t.min_s * 1e3, t.max_s * 1e3
        row.first_call_ms, row.reps = t.first_call_s * 1e3, t.reps
        row.samples_per_s = cell.G * cell.n / t.median_s
        row.bytes_moved = inputs.bytes_moved()
        row.eff_GBps = row.bytes_moved / t.median_s / 1e9
        row.copy_GBps = bw / 1e9
        row.x_copy_bound = t.median_s / (row.bytes_moved / bw) if bw == bw else math.nan


# ------------------------------------------------------------------------------------------------
# Grids
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A ratio the issue asks for: ``slow`` time / ``fast`` time >= ``need`` in one cell."""

    name: str
    estimator: str
    G: int
    n: int
    k_rule: str
    fast: str            # a method name, or "best": the fastest non-reference backend
    slow: str
    need: float
    max_threads_only: bool = False   # a pure Python loop: measured at the largest thread count only


TARGETS = (
    Target("cpu kernel vs torch reference, G=4096 n=16", "maxk_loo1", 4096, 16, "4", "cpu", "torch", 5.0),
    Target("cpu kernel vs torch reference, G=4096 n=16 (off-policy)", "maxk_offpolicy", 4096, 16, "4",
           "cpu", "torch", 5.0),
    Target("cpu kernel vs n x n matrix, n=1024 (off-policy)", "maxk_offpolicy", 64, 1024, "n/2", "cpu",
           "maxk_matrix", 100.0),
    Target("cpu kernel vs n x n matrix, n=1024 (on-policy)", "maxk", 64, 1024, "n/2", "cpu", "maxk_matrix", 100.0),
    Target("torch reference vs per-group Python loop, G=16384 n=16 (grpo)", "grpo", 16384, 16, "1", "torch",
           "verl_loop", 10.0),
    Target("torch reference vs per-group Python loop, G=16384 n=16 (PKPO)", "maxk_loo1", 16384, 16, "4", "torch",
           "verl_loop", 10.0, max_threads_only=True),
)

GPU_TARGETS = (
    Target("best GPU backend vs torch reference on GPU, G=16384 n=16", "maxk_loo1", 16384, 16, "4", "best",
           "torch", 1.0),
    Target("best GPU backend vs n x n matrix on GPU, n=1024 (off-policy)", "maxk_offpolicy", 1024, 1024, "n/2",
           "best", "maxk_matrix", 1.0),
)


def target_cells(threads: list[int], targets=TARGETS) -> list[Cell]:
    """One cell per target and thread count, running the backends and the target's slower method."""
    merged: dict[tuple, set] = {}
    for th in threads:
        for t in targets:
            if t.max_threads_only and th != max(threads):
                continue
            key = (th, t.estimator, t.G, t.n, t.k_rule)
            merged.setdefault(key, set(M.BACKENDS)).add(t.slow)
    return [Cell("target", th, est, G, n, rule, k_for(rule, n), tuple(sorted(ms)))
            for (th, est, G, n, rule), ms in merged.items()]


def sweep_cells(threads: list[int], estimators: dict[str, tuple[str, ...]], Gs=SWEEP_G, ns=SWEEP_N) -> list[Cell]:
    """Every (estimator, G, n, k) of the grid, ordered by size so small cells calibrate the skips."""
    cells = []
    for th in threads:
        for est, rules in estimators.items():
            for G in Gs:
                for n in ns:
                    for rule, k in k_rules_for(n, rules if est != "grpo" else ("1",)):
                        cells.append(Cell("sweep", th, est, G, n, rule, k))
    cells.sort(key=lambda c: (c.threads, c.G * c.n, c.n, c.estimator, K_RULES.index(c.k_rule)))
    return cells


def rows_as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
