"""Turn results.csv files into markdown tables and plots, and assemble bench/RESULTS.md.

``python -m bench.report`` rebuilds bench/RESULTS.md from every bench/results/<name>/ that holds a
results.csv (cpu, gpu, ...), so a GPU run made elsewhere is added by copying its folder in and
running this. A hand-written ANALYSIS.md in a result folder is included verbatim.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections import defaultdict

from bench.sweep import GPU_TARGETS, TARGETS

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("torch", "cpu", "triton", "cuda")
FLOAT_FIELDS = {"median_ms", "min_ms", "max_ms", "first_call_ms", "samples_per_s", "peak_mem_bytes",
                "eff_GBps", "copy_GBps", "x_copy_bound", "max_rel_err"}
INT_FIELDS = {"threads", "G", "n", "k", "reps", "bytes_moved"}


def load_rows(path: str) -> list[dict]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in FLOAT_FIELDS:
                r[k] = float(r[k]) if r.get(k) not in (None, "", "nan") else math.nan
            for k in INT_FIELDS:
                r[k] = int(r[k]) if r.get(k) not in (None, "") else 0
            rows.append(r)
    return rows


def load_env(result_dir: str) -> dict:
    p = os.path.join(result_dir, "env.json")
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

def _ok(r: dict) -> bool:
    return r["status"] == "ok" and r["median_ms"] == r["median_ms"]


def _cells(rows):
    """(section, threads, estimator, G, n, k) -> {method: row}"""
    cells = defaultdict(dict)
    for r in rows:
        cells[(r["section"], r["threads"], r["estimator"], r["G"], r["n"], r["k"])][r["method"]] = r
    return cells


def fastest_backend(by_method: dict) -> str | None:
    """The fastest non-reference backend in a cell (the reference itself when it is the only one)."""
    cands = [m for m in BACKENDS[1:] if m in by_method and _ok(by_method[m])]
    if not cands:
        return "torch" if "torch" in by_method and _ok(by_method["torch"]) else None
    return min(cands, key=lambda m: by_method[m]["median_ms"])


def _fmt_ms(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] == "skipped":
        return "skip"
    if r["status"] == "error":
        return "error"
    v = r["median_ms"]
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def _fmt_ratio(x: float) -> str:
    if x != x:
        return ""
    return f"{x:.2g}x" if x < 10 else f"{x:,.0f}x"


def _fmt_bytes(b: float) -> str:
    if b != b:
        return "n/a"
    return f"{b / 2**20:.1f}"


def _method_order(methods):
    order = list(BACKENDS) + ["pkpo_listing", "pkpo_listing_cached", "maxk_matrix", "verl_loop", "verl"]
    return sorted(methods, key=lambda m: order.index(m) if m in order else len(order))


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------

def target_table(rows: list[dict], gpu: bool) -> str:
    cells = _cells(rows)
    lines = ["| target | threads | faster | slower | faster ms | slower ms | ratio | ratio of min times | needed | met |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in (GPU_TARGETS if gpu else TARGETS):
        name, est, G, n, fast, slow, need = t.name, t.estimator, t.G, t.n, t.fast, t.slow, t.need
        found = False
        for key, by in sorted(cells.items()):
            section, threads, e, g_, n_, k_ = key
            if section != "target" or (e, g_, n_) != (est, G, n):
                continue
            found = True
            f_name = fastest_backend(by) if fast == "best" else fast
            fr, sr = by.get(f_name), by.get(slow)
            if fr is None or sr is None or not _ok(fr) or not _ok(sr):
                missing = [x for x, r in ((f_name, fr), (slow, sr)) if r is None or not _ok(r)]
                why = "; ".join(f"{x}: {(by[x]['status'] + ' ' + by[x]['note']) if x in by else 'not run'}"
                                for x in missing if x)
                lines.append(f"| {name} | {threads if not gpu else '-'} | {f_name} | {slow} | | | | | {need:g}x "
                             f"| not measured ({why or 'no backend'}) |")
                continue
            ratio = sr["median_ms"] / fr["median_ms"]
            ratio_min = sr["min_ms"] / fr["min_ms"]
            met = "yes" if ratio >= need else "**no**"
            lines.append(f"| {name} | {threads if not gpu else '-'} | {f_name} | {slow} | {_fmt_ms(fr)} | "
                         f"{_fmt_ms(sr)} | {_fmt_ratio(ratio)} | {_fmt_ratio(ratio_min)} | {need:g}x | {met} |")
        if not found:
            lines.append(f"| {name} | | | {slow} | | | | | {need:g}x | not run |")
    return "\n".join(lines)


def estimator_table(rows: list[dict], estimator: str, threads: int, section: str = "sweep") -> str:
    cells = {k: v for k, v in _cells(rows).items()
             if k[0] == section and k[1] == threads and k[2] == estimator}
    if not cells:
        return ""
    methods = _method_order({m for by in cells.values() for m in by})
    backends = [m for m in methods if m in BACKENDS]
    others = [m for m in methods]
    head = ["G", "n", "k"] + [f"{m} ms" for m in methods] + ["fastest"] + \
           [f"vs {m}" for m in others] + ["Msamples/s", "peak MiB", "GB/s", "x copy-bound", "max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (_, _, _, G, n, k), by in sorted(cells.items(), key=lambda kv: (kv[0][3], kv[0][4], kv[0][5])):
        best = fastest_backend(by)
        br = by.get(best) if best else None
        ratios = []
        for m in others:
            r = by.get(m)
            if br is None or r is None or not _ok(r) or m == best:
                ratios.append("")
            else:
                ratios.append(_fmt_ratio(r["median_ms"] / br["median_ms"]))
        if br is not None:
            errs = [by[m]["max_rel_err"] for m in methods if m in by and by[m]["max_rel_err"] == by[m]["max_rel_err"]]
            tail = [f"{br['samples_per_s'] / 1e6:.3g}", _fmt_bytes(br["peak_mem_bytes"]),
                    f"{br['eff_GBps']:.3g}", f"{br['x_copy_bound']:.3g}",
                    f"{max(errs):.1e}" if errs else ""]
        else:
            tail = [""] * 5
        lines.append("| " + " | ".join([f"{G:,}", str(n), str(k)] + [_fmt_ms(by.get(m)) for m in methods]
                                       + [best or ""] + ratios + tail) + " |")
    _ = backends
    return "\n".join(lines)


def memory_table(rows: list[dict], threads: int | None) -> str:
    """Peak memory (MiB) per method at a few representative cells."""
    cells = _cells(rows)
    picks = [k for k in cells if k[0] == "target" and (threads is None or k[1] == threads)]
    if not picks:
        return ""
    methods = _method_order({m for k in picks for m in cells[k]})
    lines = ["| threads | estimator | G | n | k | " + " | ".join(methods) + " |", "|" + "---|" * (5 + len(methods))]
    for k in sorted(picks, key=lambda x: (x[1], x[2], x[3], x[4])):
        by = cells[k]
        vals = [(_fmt_bytes(by[m]["peak_mem_bytes"]) if m in by and _ok(by[m]) else "") for m in methods]
        lines.append(f"| {k[1] if k[1] else '-'} | {k[2]} | {k[3]:,} | {k[4]} | {k[5]} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def bandwidth_table(rows: list[dict], copy_gbps: dict) -> str:
    """Every backend's effective bandwidth and distance from the copy bound at the target cells."""
    cells = _cells(rows)
    picks = sorted((k for k in cells if k[0] == "target"), key=lambda x: (x[1], x[2], x[3], x[4]))
    backends = [b for b in BACKENDS if any(b in cells[k] and _ok(cells[k][b]) for k in picks)]
    if not picks or not backends:
        return ""
    lines = ["| threads | estimator | G | n | k | bytes moved | copy-bound time (us) | "
             + " | ".join(f"{b}: GB/s (x bound)" for b in backends) + " |",
             "|" + "---|" * (7 + len(backends))]
    for k in picks:
        by = cells[k]
        some = next(r for r in by.values())
        bw = copy_gbps.get(str(k[1]), copy_gbps.get("0"))
        bound_us = f"{some['bytes_moved'] / (bw * 1e9) * 1e6:.3g}" if bw and some["bytes_moved"] else ""
        vals = []
        for b in backends:
            r = by.get(b)
            vals.append(f"{r['eff_GBps']:.3g} ({r['x_copy_bound']:.3g}x)" if r is not None and _ok(r) else "")
        lines.append(f"| {k[1] if k[1] else '-'} | {k[2]} | {k[3]:,} | {k[4]} | {k[5]} | "
                     f"{some['bytes_moved']:,} | {bound_us} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def skipped_summary(rows: list[dict]) -> str:
    groups = defaultdict(list)
    for r in rows:
        if r["status"] in ("skipped", "error"):
            reason = r["note"]
            if reason.startswith("predicted"):
                reason = "predicted time per call above the cap (from smaller cells)"
            elif reason.startswith("G*n ="):
                reason = "G*n " + reason.split(" above ", 1)[1]
            groups[(r["method"], r["status"], reason)].append(r)
    if not groups:
        return "Nothing was skipped."
    lines = ["| method | status | reason | cells | largest G*n |", "|---|---|---|---|---|"]
    for (m, st, why), rs in sorted(groups.items()):
        lines.append(f"| {m} | {st} | {why} | {len(rs)} | {max(r['G'] * r['n'] for r in rs):,} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------

def _plot_Gs(rows: list[dict], threads: int) -> list[int]:
    Gs = sorted({r["G"] for r in rows if r["section"] == "sweep" and r["threads"] == threads and _ok(r)})
    picked = [G for G in (64, 1024) if G in Gs]
    return picked or Gs[:1]


def plot_time_vs_n(rows: list[dict], path: str, threads: int, title: str) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Gs = _plot_Gs(rows, threads)
    ests = [e for e in ("maxk_loo1", "maxk_offpolicy", "maxk") if any(r["estimator"] == e for r in rows)]
    if not Gs or not ests:
        return False
    fig, axes = plt.subplots(len(Gs), len(ests), figsize=(5.5 * len(ests), 4.5 * len(Gs)), squeeze=False)
    for row_axes, G in zip(axes, Gs):
        for ax, est in zip(row_axes, ests):
            sel = [r for r in rows if r["section"] == "sweep" and r["threads"] == threads and r["G"] == G
                   and r["estimator"] == est and r["k"] == max(1, r["n"] // 2) and _ok(r)]
            for m in _method_order({r["method"] for r in sel}):
                pts = sorted((r["n"], r["median_ms"]) for r in sel if r["method"] == m)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
            ns = sorted({r["n"] for r in sel})
            if len(ns) >= 2:
                ref = max((r["median_ms"] for r in sel if r["n"] == ns[0]), default=None)
                if ref:
                    for p, style in ((1, ":"), (2, "--")):
                        ax.plot(ns, [ref * (n / ns[0]) ** p for n in ns], "k" + style, lw=0.8,
                                label=f"slope {p} (time ~ n^{p})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("group size n")
            ax.set_ylabel("time per call (ms)")
            ax.set_title(f"{est}, G={G}, k=n/2")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_speedup_vs_G(rows: list[dict], path: str, threads: int, title: str, n: int = 16) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells([r for r in rows if r["section"] == "sweep" and r["threads"] == threads and r["n"] == n])
    ests = [e for e in ("maxk_loo1", "maxk_offpolicy", "grpo") if any(k[2] == e for k in cells)]
    if not ests:
        return False
    fig, axes = plt.subplots(1, len(ests), figsize=(5.5 * len(ests), 4.5), squeeze=False)
    any_line = False
    for ax, est in zip(axes[0], ests):
        k_want = 1 if est == "grpo" else 4
        series = defaultdict(list)
        fast_names = set()
        for (_, _, e, G, n_, k), by in cells.items():
            if e != est or k != k_want:
                continue
            best = fastest_backend(by)
            if best is None:
                continue
            fast_names.add(best)
            for m, r in by.items():
                if m != best and _ok(r):
                    series[m].append((G, r["median_ms"] / by[best]["median_ms"]))
        for m in _method_order(series):
            pts = sorted(series[m])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{m} / fastest")
            any_line = True
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("number of groups G")
        ax.set_ylabel("speed-up of the fastest backend")
        ax.set_title(f"{est}, n={n}, k={k_want} (fastest: {', '.join(sorted(fast_names))})")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return any_line


# ------------------------------------------------------------------------------------------------
# Documents
# ------------------------------------------------------------------------------------------------

def section_markdown(result_dir: str, rel_to: str, make_plots: bool = True) -> str:
    rows = load_rows(os.path.join(result_dir, "results.csv"))
    env = load_env(result_dir)
    gpu = env.get("device") == "cuda"
    name = os.path.relpath(result_dir, rel_to)
    out = [f"## {'GPU' if gpu else 'CPU'} results (`{name}`)", ""]
    machine = env.get("gpu", "") + (" on " if gpu else "") + f"{env.get('host_cpu', '?')}, " \
        f"{env.get('logical_cpus', '?')} logical CPUs"
    out += [f"* Date: {env.get('date_utc', '?')}; mode: {env.get('mode', '?')}; run time "
            f"{env.get('elapsed_s', float('nan')):.0f} s of a {env.get('budget_s', float('nan')):.0f} s budget",
            f"* Machine: {machine}; {env.get('platform', '')}",
            f"* Versions: Python {env.get('python', '?')}, torch {env.get('torch', '?')}, triton "
            f"{env.get('triton', '?')}, numpy {env.get('numpy', '?')}, bonkernels {env.get('bonkernels_commit', '?')}"
            + (f", CUDA {env.get('cuda_runtime')}" if gpu else ""),
            f"* Load average (1/5/15 min) at start: {env.get('load_average_start', '?')}, at end: "
            f"{env.get('load_average_end', '?')}"]
    sw = env.get("sweep_run")
    if sw:
        out.append(f"* The target cells come from the run above; the sweep from a second run on "
                   f"{sw.get('date_utc')} ({sw.get('elapsed_s') or 0:.0f} s of a {sw.get('budget_s')} s budget, "
                   f"options {sw.get('options')}, load average at start {sw.get('load_average_start')}, "
                   f"at end {sw.get('load_average_end')}, copy bandwidth "
                   + ", ".join(f"{v:.1f} GB/s ({k} threads)" for k, v in (sw.get("copy_GBps") or {}).items())
                   + ", bonkernels " + str(sw.get("bonkernels_commit")) + ")")
    bws = env.get("copy_GBps", {})
    if bws:
        out.append("* Copy bandwidth measured in this run (read + write bytes / time of a large "
                   "`dst.copy_(src)`): " + ", ".join(
                       (f"{v:.1f} GB/s" if k == "0" else f"{v:.1f} GB/s with {k} thread(s)") for k, v in bws.items()))
    for m, why in env.get("unavailable", {}).items():
        out.append(f"* Not run: `{m}`: {why}")
    out.append("")
    analysis = os.path.join(result_dir, "ANALYSIS.md")
    if os.path.exists(analysis):
        with open(analysis) as f:
            out += [f.read().strip(), ""]
    out += ["### Targets", "", target_table(rows, gpu), ""]
    mem = memory_table(rows, None)
    if mem:
        out += ["### Peak memory at the target cells (MiB)", "",
                ("GPU: `torch.cuda.max_memory_allocated` minus what was allocated before the call."
                 if gpu else
                 "CPU: resident-set high-water mark during one extra call minus the resident set before "
                 "it (VmHWM after a reset through /proc/self/clear_refs; for that call glibc gives every "
                 "buffer above 128 KiB fresh pages, after returning free heap memory to the OS). It "
                 "counts output, temporaries and Python objects; page granularity (4 KiB). "
                 "Empty: not probed (calls over 2 s) or not measured."), "", mem, ""]
    bwt = bandwidth_table(rows, env.get("copy_GBps", {}))
    if bwt:
        out += ["### Distance from the memory-bound limit (target cells)", "",
                "The least traffic is reading the rewards (and deltas) once and writing the advantages "
                "once; at the copy bandwidth measured in this run that takes the copy-bound time. "
                "`x bound` = measured time / copy-bound time (1 = as fast as a copy).", "", bwt, ""]
    if make_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            make_plots = False
            out += ["(matplotlib is not installed here: no plots; rebuild with `python -m bench.report`.)", ""]
    if make_plots:
        th = max((r["threads"] for r in rows if r["section"] == "sweep"), default=0)
        label = f"{'GPU' if gpu else f'CPU, {th} thread(s)'}"
        for fname, fn in (("time_vs_n.png", plot_time_vs_n), ("speedup_vs_G.png", plot_speedup_vs_G)):
            p = os.path.join(result_dir, fname)
            if fn(rows, p, th, label):
                out += [f"![{fname}]({os.path.relpath(p, rel_to)})", ""]
    threads = sorted({r["threads"] for r in rows if r["section"] == "sweep"})
    est_order = ("maxk_loo1", "maxk_offpolicy", "maxk", "grpo")
    for th in threads:
        for est in est_order:
            t = estimator_table(rows, est, th)
            if t:
                what = "GPU" if gpu else f"{th} thread(s)"
                out += [f"### `{est}`, {what}: median time per call (ms) and speed-ups", "",
                        "`vs X` = time of X / time of the fastest backend in the same cell. Msamples/s, "
                        "peak MiB, GB/s (bytes moved / time; bytes = rewards in [+ deltas in] + "
                        "advantages out) and x copy-bound (time / (bytes / copy bandwidth)) are the "
                        "fastest backend's. max rel err: the largest deviation of any method from the "
                        "torch reference in the cell, relative to the reference's largest value.", "", t, ""]
    for th in sorted({r["threads"] for r in rows if r["section"] == "target"}):
        for est in est_order:
            t = estimator_table(rows, est, th, section="target")
            if t:
                what = "GPU" if gpu else f"{th} thread(s)"
                out += [f"### Target cells, `{est}`, {what}", "", t, ""]
    out += ["### Skipped or failed cells", "", skipped_summary(rows), ""]
    return "\n".join(out)


HEADER = """# bonkernels benchmarks

`bk.advantages` (every backend present at run time) against the papers' own algorithms written
plainly in PyTorch and against the per-group Python loop trainers use, on the same inputs in the
same run. Generated by `python -m bench.report` from the CSV files under `bench/results/`; the
commands, the methods and how things are measured are in `bench/README.md`.

Methods:

| method | what |
|---|---|
| `torch` | `bk.advantages(..., backend="torch")`: the pure-PyTorch reference (vectorised, float64 tables) |
| `cpu` | `bk.advantages(..., backend="cpu")`: the native C++ kernel |
| `triton` / `cuda` | `bk.advantages` on a GPU with the Triton / native CUDA kernels |
{baselines}

Inputs: rewards ~ U(0, 1) in float32 as a full [G, n] tensor; off-policy deltas ~ U(-0.1, 0.1),
`clamp_delta=0.2`; backends are called with `check_inputs=False, max_group_size=n` (validation off,
as a trainer that trusts its rewards would call it; the baselines do not validate either).
"""


def build_results_md(results_root: str, out_path: str, make_plots: bool = True) -> str:
    from bench.methods import BASELINE_DESCRIPTIONS

    base = "\n".join(f"| `{k}` | {v} |" for k, v in BASELINE_DESCRIPTIONS.items())
    parts = [HEADER.format(baselines=base)]
    root_rel = os.path.dirname(os.path.abspath(out_path))
    for name in ("cpu", "gpu"):
        d = os.path.join(results_root, name)
        if os.path.exists(os.path.join(d, "results.csv")):
            parts.append(section_markdown(d, root_rel, make_plots))
        else:
            parts.append(f"## {name.upper()} results\n\nNot recorded yet: see `bench/README.md` for the command.\n")
    # Sections written by hand next to their own results (bench/results/<name>/SECTION.md: the
    # static proxies, the CPU limits) survive a rebuild.
    for name in sorted(os.listdir(results_root)) if os.path.isdir(results_root) else []:
        extra = os.path.join(results_root, name, "SECTION.md")
        if os.path.exists(extra):
            with open(extra) as f:
                parts.append(f.read().strip() + "\n")
    text = "\n".join(parts)
    with open(out_path, "w") as f:
        f.write(text)
    return out_path


def merge_sweep(dst_dir: str, src_dir: str) -> None:
    """Replace the sweep rows of ``dst_dir`` with those of another run (``src_dir``), keeping the
    target rows; env.json records both runs (e.g. targets at a quiet time, a longer sweep later)."""
    keep = [r for r in _raw_rows(dst_dir) if r["section"] != "sweep"]
    new = [r for r in _raw_rows(src_dir) if r["section"] == "sweep"]
    fields = list(keep[0].keys() if keep else new[0].keys())
    with open(os.path.join(dst_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(keep + new)
    env, src_env = load_env(dst_dir), load_env(src_dir)
    env["sweep_run"] = {k: src_env.get(k) for k in ("date_utc", "elapsed_s", "budget_s", "load_average_start",
                                                    "load_average_end", "copy_GBps", "bonkernels_commit",
                                                    "options")}
    with open(os.path.join(dst_dir, "env.json"), "w") as f:
        json.dump(env, f, indent=1)


def _raw_rows(d: str) -> list[dict]:
    with open(os.path.join(d, "results.csv"), newline="") as f:
        return list(csv.DictReader(f))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "RESULTS.md"))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--merge-sweep", nargs=2, metavar=("DST", "SRC"),
                    help="replace DST's sweep rows by SRC's (then rebuild)")
    a = ap.parse_args(argv)
    if a.merge_sweep:
        merge_sweep(*a.merge_sweep)
    print(build_results_md(a.results, a.out, not a.no_plots))


if __name__ == "__main__":
    main()
