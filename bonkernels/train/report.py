"""End-of-run outputs: summary.json, PNG plots, and a one-screen table."""

from __future__ import annotations

import os

from . import checkpoint as ckpt


def _ks(record: dict) -> list[int]:
    return sorted(int(key.split("@")[1]) for key in record if key.startswith("pass@"))


def finish(out: str, records: list[dict], config: dict, *, plots: bool = True) -> dict:
    evals = [r for r in records if r.get("kind") == "eval"]
    train = [r for r in records if r.get("kind") == "train"]
    summary = {
        "estimator": config.get("estimator"), "model": config.get("model"),
        "task": config.get("task"), "seed": config.get("seed"), "steps": config.get("steps"),
        "initial": evals[0] if evals else None,
        "final": evals[-1] if evals else None,
        "train_seconds": sum(r["step_seconds"] for r in train),
    }
    ckpt.atomic_write_json(summary, os.path.join(out, "summary.json"))
    if plots and (evals or train):
        plot_run(out, train, evals, title=f"{config.get('estimator')} on {config.get('task')}")
    return summary


def plot_run(out: str, train: list[dict], evals: list[dict], title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    if train:
        steps = [r["step"] for r in train]
        axes[0].plot(steps, [r["reward_mean"] for r in train], label="mean reward", alpha=0.8)
        axes[0].plot(steps, [r["solved_frac"] for r in train], label="solved fraction", alpha=0.8)
        axes[0].set_xlabel("step")
        axes[0].set_title("training batches")
        axes[0].legend()
        axes[1].plot(steps, [r["loss"] for r in train], color="tab:red")
        axes[1].set_xlabel("step")
        axes[1].set_title("loss")
    if evals:
        ks = _ks(evals[-1])
        steps = [r["step"] for r in evals]
        for k in ks:
            axes[2].plot(steps, [r[f"pass@{k}"] for r in evals], marker="o", ms=3, label=f"pass@{k}")
        axes[2].set_xlabel("step")
        axes[2].set_title("eval pass@k")
        axes[2].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plots", "training.png"), dpi=100)
    plt.close(fig)
    if evals:
        fig, ax = plt.subplots(figsize=(6, 4))
        ks = _ks(evals[-1])
        for rec, style in ((evals[0], "--"), (evals[-1], "-")):
            ax.plot(ks, [rec[f"pass@{k}"] for k in ks], style, marker="o", label=f"pass@k, step {rec['step']}")
            ax.plot(ks, [rec[f"max@{k}"] for k in ks], style, marker="s", alpha=0.6,
                    label=f"max@k, step {rec['step']}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "plots", "pass_at_k.png"), dpi=100)
        plt.close(fig)


def summary_table(summary: dict) -> str:
    first, last = summary.get("initial"), summary.get("final")
    if not last:
        return "(no evaluation was run)"
    lines = [f"{summary['estimator']} on {summary['task']} ({summary['model']}), seed "
             f"{summary['seed']}: eval at step {first['step']} -> step {last['step']} "
             f"({last['num_prompts']} prompts)",
             f"{'k':>5} | {'pass@k start':>12} {'pass@k end':>10} | {'max@k start':>11} {'max@k end':>9}",
             "-" * 58]
    for k in _ks(last):
        lines.append(f"{k:>5} | {first[f'pass@{k}']:>12.3f} {last[f'pass@{k}']:>10.3f} | "
                     f"{first[f'max@{k}']:>11.3f} {last[f'max@{k}']:>9.3f}")
    lines.append(f"mean reward {first['reward_mean']:.3f} -> {last['reward_mean']:.3f}; "
                 f"training took {summary['train_seconds']:.0f} s")
    return "\n".join(lines)
