"""Plots of the pass@k experiment: final pass@k / max@k against k (k = 1..eval_n), and pass@k /
max@k against sampled training completions, per arm, with mean ± sd bands over seeds."""

from __future__ import annotations

import numpy as np

from . import experiment_report as rep
from . import experiment_stats as st


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n):
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def plot_at_k(data: dict, arms, path: str) -> None:
    """pass@k and max@k for every k = 1..eval_n at the final step; the warm start dashed."""
    plt = _plt()
    ks = list(range(1, data["eval_n"] + 1))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    arms = [a for a in arms if data["arms"].get(a)]
    for ax, kind in zip(axes, ("pass", "max")):
        if data["warm"]:
            stats = [st.mean_sd(rep.dataset_metric(data["warm"], f"{kind}@{k}")) for k in ks]
            m = np.array([x for x, _ in stats])
            s = np.array([y for _, y in stats])
            ax.plot(ks, m, "k--", label=f"warm start ({len(data['warm'])} evals)")
            ax.fill_between(ks, m - s, m + s, color="k", alpha=0.1)
        for arm, color in zip(arms, _colors(len(arms))):
            ft = rep.final_tables(data, arm)
            stats = [st.mean_sd(rep.dataset_metric(ft, f"{kind}@{k}")) for k in ks]
            m = np.array([x for x, _ in stats])
            s = np.array([y for _, y in stats])
            ax.plot(ks, m, color=color, marker="o", ms=2.5, label=f"{arm} ({len(ft)} seeds)")
            ax.fill_between(ks, m - s, m + s, color=color, alpha=0.12)
        ax.set_xscale("log", base=2)
        ticks = [k for k in ks if k & (k - 1) == 0 or k == ks[-1]]
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.set_xlabel("k")
        ax.set_ylabel(f"{kind}@k")
        ax.set_title(f"{kind}@k at step {data['steps']} (mean ± sd over seeds)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(res: dict, path: str, arms=None) -> None:
    """One panel per metric of res["curves"] (pass@1, pass@4, pass@eval_n, max@...): the metric
    against sampled training completions, mean ± sd over seeds, one line per arm (all, or
    ``arms``)."""
    plt = _plt()
    curves = {a: c for a, c in res["curves"].items() if arms is None or a in arms}
    if not curves:
        return
    metrics = list(next(iter(curves.values())))
    cols = (len(metrics) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(5 * cols, 8), squeeze=False)
    arms = list(curves)
    for i, metric in enumerate(metrics):
        ax = axes[i // cols][i % cols]
        for arm, color in zip(arms, _colors(len(arms))):
            c = curves[arm][metric]
            x, m, s = np.array(c["samples"]), np.array(c["mean"]), np.array(c["sd"])
            ax.plot(x, m, color=color, marker="o", ms=2.5, label=arm)
            ax.fill_between(x, m - s, m + s, color=color, alpha=0.08)
        ax.set_title(f"{metric} against sampled completions")
        ax.set_xlabel("training completions sampled")
        ax.grid(alpha=0.3)
    for j in range(len(metrics), 2 * cols):
        axes[j // cols][j % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_diff_vs_reference(data: dict, arms, reference: str, path: str, *, n_boot: int = 500) -> None:
    """Final pass@k and max@k minus the reference arm's (GRPO), k = 1..eval_n, per arm: the paired
    mean difference with its 95% bootstrap band over prompts and seeds."""
    plt = _plt()
    if not data["arms"].get(reference):
        return
    ref = rep.final_tables(data, reference)
    arms = [a for a in arms if a != reference and data["arms"].get(a)]
    ks = list(range(1, data["eval_n"] + 1))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for ax, kind in zip(axes, ("pass", "max")):
        ax.axhline(0.0, color="k", lw=0.8)
        for arm, color in zip(arms, _colors(len(arms))):
            ft = rep.final_tables(data, arm)
            comps = [rep.compare(ft, ref, f"{kind}@{k}", n_boot=n_boot) for k in ks]
            ax.plot(ks, [c["diff"] for c in comps], color=color, marker="o", ms=2.5, label=arm)
            ax.fill_between(ks, [c["lo"] for c in comps], [c["hi"] for c in comps], color=color,
                            alpha=0.08)
        ax.set_xscale("log", base=2)
        ticks = [k for k in ks if k & (k - 1) == 0 or k == ks[-1]]
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.set_xlabel("k")
        ax.set_ylabel(f"{kind}@k − {reference}")
        ax.set_title(f"{kind}@k minus {reference} at step {data['steps']} (paired, 95% band)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_per_arm(data: dict, arms, path: str, kind: str = "pass") -> None:
    """One panel per arm: pass@k (or max@k) for k = 1, 2, 4, ..., eval_n against sampled training
    completions, mean ± sd over seeds; the same y-axis everywhere."""
    plt = _plt()
    arms = [a for a in arms if data["arms"].get(a)]
    if not arms:
        return
    from .evaluate import eval_ks

    ks = eval_ks(data["eval_n"])
    cols = min(4, len(arms))
    rows = (len(arms) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False,
                             sharex=True, sharey=True)
    colors = _colors(len(ks))
    for i, arm in enumerate(arms):
        ax = axes[i // cols][i % cols]
        cur = rep.curves(data, arm, [f"{kind}@{k}" for k in ks])
        for k, color in zip(ks, colors):
            c = cur[f"{kind}@{k}"]
            x, m, s = np.array(c["samples"]), np.array(c["mean"]), np.array(c["sd"])
            ax.plot(x, m, color=color, marker="o", ms=2.5, label=f"k={k}")
            ax.fill_between(x, m - s, m + s, color=color, alpha=0.15)
        ax.set_title(arm, fontsize=9)
        ax.grid(alpha=0.3)
    for j in range(len(arms), rows * cols):
        axes[j // cols][j % cols].axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("training completions sampled")
    axes[0][0].set_ylabel(f"{kind}@k")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{kind}@k against sampled completions, per arm (mean ± sd over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
