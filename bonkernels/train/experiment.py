"""The pass@k experiment: several estimators x seeds from one shared warm start, then a table and
plots of pass@k / max@k with the spread over seeds.

    python -m bonkernels.train.experiment --config experiments/passk/config.json \\
        --out experiments/passk --runs runs/passk --jobs 2

Each run is ``python -m bonkernels.train`` in its own process (``--threads 1``, ``--jobs`` at a
time), logging to RUNS/<name>/log.txt; finished runs are skipped and interrupted ones resumed, so
the command can simply be started again. The warm start is computed once (a first run with
``--steps 0``, which also evaluates the base policy) and cached for the others.

A config with a "train" section is a full experiment (experiments/passk2/config.json):

    {"train": {driver settings, as for --config of python -m bonkernels.train},
     "seeds": [0, 1, ...],
     "arms": [{"name": "maxk_loo1 k=4", "estimator": "maxk_loo1", "flags": {"k": 4}}, ...],
     "analysis": {"grpo": NAME, "maxk_family": [NAMES], "anneal": NAME, "maxrl": NAME,
                  "harmonic": NAME, "offpolicy_one_epoch": NAME, "offpolicy_reuse": [NAMES],
                  "gradvar": {"arms": [MAXRL, HARMONIC], "repeats": R}}}

    python -m bonkernels.train.experiment --config experiments/passk2/config.json \
        --out experiments/passk2 --runs runs/passk2 --jobs 2

Every run writes its evaluations' per-prompt rewards (--eval-records); the shared warm start is
evaluated once per seed (with that seed's evaluation sampling seed) instead of at step 0 of every
run; the gradient-variance measurement (experiment_gradvar) is one more job. Then
experiment_report compares the arms with paired tests over prompts and seeds and states each
claim; experiment_plots draws pass@k / max@k against k and against sampled completions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from . import checkpoint as ckpt

DEFAULT_ARMS = ("grpo", "maxk_loo1", "maxk_offpolicy:--ppo-epochs=3")


def parse_arm(text: str) -> tuple[str, str, list[str]]:
    """'maxk_offpolicy:--ppo-epochs=3' -> (label, estimator, extra flags)."""
    estimator, *extra = text.split(":")
    flags = [f for part in extra for f in part.split(",") if f]
    label = estimator + ("".join(" " + f.lstrip("-") for f in flags) if flags else "")
    return label, estimator, flags


def _launch(args: list[str], log_path: str, module: str = "bonkernels.train"):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    log = open(log_path, "a")
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env), log


def _finished(run_dir: str, steps: int) -> bool:
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        final = json.load(f).get("final") or {}
    return final.get("step") == steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bonkernels.train.experiment",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="settings shared by every run (JSON)")
    p.add_argument("--out", required=True, help="where the table, plots and results.json go")
    p.add_argument("--runs", default="runs/passk", help="per-run directories (checkpoints, logs)")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS),
                   help="estimator[:flag=value,...] per arm")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", nargs="+", default=None,
                   help="full experiment: run only these arms (by name); the report covers them")
    p.add_argument("--report-only", action="store_true",
                   help="full experiment: rebuild the report from the runs, start nothing")
    p.add_argument("--dry-run", action="store_true",
                   help="full experiment: print the commands, start nothing")
    args = p.parse_args(argv)

    with open(args.config) as f:
        settings = json.load(f)
    if "train" in settings:
        return run_experiment(args, settings, argv_seeds="--seeds" in (argv or sys.argv[1:]))
    steps = int(settings["steps"])
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.runs, exist_ok=True)
    cache = os.path.join(args.runs, "warmstart-cache")
    common = ["--config", args.config, "--warmstart-cache", cache, "--threads", "1",
              "--progress", "off", "--no-export"]
    start = time.time()

    base_dir = os.path.join(args.runs, "warmstart")
    if not _finished(base_dir, 0):
        os.makedirs(base_dir, exist_ok=True)
        print("warm start (shared by every run) ...", flush=True)
        proc, log = _launch([*common, "--steps", "0", "--eval-every", "1", "--out", base_dir,
                             "--no-plots"], os.path.join(base_dir, "log.txt"))
        if proc.wait() != 0:
            raise SystemExit(f"the warm start failed; see {base_dir}/log.txt")
        log.close()
    print(f"warm start ready ({time.time() - start:.0f} s)", flush=True)

    queue = []
    for arm in args.arms:
        label, estimator, flags = parse_arm(arm)
        for seed in args.seeds:
            name = f"{estimator}{''.join(f.replace('--', '_').replace('=', '') for f in flags)}-s{seed}"
            run_dir = os.path.join(args.runs, name)
            if _finished(run_dir, steps):
                continue
            os.makedirs(run_dir, exist_ok=True)
            resume = ["--resume"] if os.path.exists(os.path.join(run_dir, "checkpoint.pt")) else []
            queue.append((name, [*common, "--estimator", estimator, "--seed", str(seed),
                                 "--out", run_dir, *flags, *resume],
                          os.path.join(run_dir, "log.txt"), "bonkernels.train", ()))
    _schedule(queue, args.jobs, start)        # a failed run is reported and left out of the table
    results = collect(args.runs, args.arms, args.seeds, steps)
    results["settings"] = settings
    results["wall_seconds_this_invocation"] = time.time() - start
    ckpt.atomic_write_json(results, os.path.join(args.out, "results.json"))
    table = results_table(results)
    ckpt.atomic_write_bytes(os.path.join(args.out, "results.md"), table.encode())
    plot_results(results, os.path.join(args.out, "pass_at_k.png"))
    plot_curves(args.runs, args.arms, args.seeds, os.path.join(args.out, "training_curves.png"))
    print(table)
    return 0


def _schedule(jobs: list, max_jobs: int, start: float) -> list:
    """Run (name, argv, log path, module, after) jobs, at most max_jobs at a time; a job waits until
    the jobs named in ``after`` are done. Returns the names of the jobs that failed."""
    queue, running, failed = list(jobs), [], []
    done = {after for job in jobs for after in job[4]} - {job[0] for job in jobs}  # finished before
    while queue or running:
        ready = [job for job in queue if set(job[4]) <= done | set(failed)]
        while ready and len(running) < max_jobs:
            job = ready.pop(0)
            queue.remove(job)
            name, run_args, log_path, module, after = job
            if set(after) & set(failed):
                failed.append(name)
                print(f"[{time.time() - start:5.0f} s] SKIPPED {name} (needs {after})", flush=True)
                continue
            proc, log = _launch(run_args, log_path, module=module)
            running.append((name, proc, log))
            print(f"[{time.time() - start:5.0f} s] started {name}", flush=True)
        if not running and queue and not ready:
            raise RuntimeError(f"jobs wait for jobs that never run: {[j[0] for j in queue]}")
        time.sleep(0.5)
        for item in list(running):
            name, proc, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                ok = proc.returncode == 0
                (done.add(name) if ok else failed.append(name))
                status = "done" if ok else f"FAILED ({proc.returncode})"
                print(f"[{time.time() - start:5.0f} s] {status} {name}", flush=True)
    return failed


def _gradvar_done(path: str, gv: dict) -> bool:
    """A gradient-variance result of these settings (arms, repeats, rewards, ...) exists."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        done = json.load(f)
    return done.get("spec") == gv


def run_experiment(args, spec: dict, argv_seeds: bool = False) -> int:
    """The full experiment of a config with "train", "seeds", "arms" and "analysis" sections."""
    from . import experiment_plots, experiment_report as rep

    train = dict(spec["train"])
    steps = int(train["steps"])
    seeds = list(args.seeds) if argv_seeds else list(spec.get("seeds", args.seeds))
    arms = [a for a in spec["arms"] if args.only is None or a["name"] in args.only]
    if args.only:
        unknown = set(args.only) - {a["name"] for a in spec["arms"]}
        if unknown:
            raise SystemExit(f"--only: no arms named {sorted(unknown)}")
    slugs = [rep.slug(a["name"]) for a in spec["arms"]]
    if len(set(slugs)) != len(slugs):
        raise SystemExit(f"two arms have the same directory name: {slugs}")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.runs, exist_ok=True)
    train_config = os.path.join(args.runs, "train_config.json")
    ckpt.atomic_write_json({**train, "eval_records": True}, train_config)
    cache = os.path.join(args.runs, "warmstart-cache")
    common = ["--config", train_config, "--warmstart-cache", cache, "--threads", "1",
              "--progress", "off", "--no-export", "--no-plots"]
    start = time.time()
    jobs = []
    first_warm = f"warmstart-s{seeds[0]}"
    for seed in seeds:  # the warm start evaluated with each seed's evaluation seed
        name = f"warmstart-s{seed}"
        run_dir = os.path.join(args.runs, name)
        if _finished(run_dir, 0):
            continue
        jobs.append((name, [*common, "--steps", "0", "--eval-every", "1", "--seed", str(seed),
                            "--out", run_dir], os.path.join(run_dir, "log.txt"), "bonkernels.train",
                     [] if name == first_warm else [first_warm]))
    gv = spec.get("analysis", {}).get("gradvar")
    gv_path = os.path.join(args.runs, "gradvar", "gradvar.json")
    if gv and not _gradvar_done(gv_path, gv) and (args.only is None or set(gv["arms"]) <= set(args.only)):
        jobs.append(("gradvar", ["--config", args.config, "--runs", args.runs],
                     os.path.join(args.runs, "gradvar", "log.txt"),
                     "bonkernels.train.experiment_gradvar", [first_warm]))
    # the most expensive runs (most optimiser passes per batch) first: a shorter tail at the end
    for arm in sorted(arms, key=lambda a: -int(a.get("flags", {}).get("ppo_epochs", 1))):
        for seed in seeds:
            name = rep.run_name(arm["name"], seed)
            run_dir = os.path.join(args.runs, name)
            if _finished(run_dir, steps):
                continue
            resume = ["--resume"] if os.path.exists(os.path.join(run_dir, "checkpoint.pt")) else []
            jobs.append((name, [*common, "--no-initial-eval", "--estimator", arm["estimator"],
                                "--seed", str(seed), "--out", run_dir,
                                *rep.flags_to_argv(arm.get("flags", {})), *resume],
                         os.path.join(run_dir, "log.txt"), "bonkernels.train", [first_warm]))
    if args.dry_run:
        for name, run_args, _, module, after in jobs:
            print(f"{name}: python -m {module} {' '.join(run_args)}"
                  + (f"   (after {', '.join(after)})" if after else ""))
        return 0
    failed = []
    if not args.report_only:
        for job in jobs:
            os.makedirs(os.path.dirname(job[2]), exist_ok=True)
        failed = _schedule(jobs, args.jobs, start)
    wall = time.time() - start
    names = [a["name"] for a in arms]
    data = rep.collect(args.runs, names, seeds, steps)
    gradvar = None
    if os.path.exists(gv_path):
        with open(gv_path) as f:
            gradvar = json.load(f)
    res = rep.analyse(data, spec, gradvar, n_boot=int(spec.get("analysis", {}).get("n_boot", 2000)))
    res["wall_seconds_this_invocation"] = wall
    res["failed"] = failed
    res["config"] = spec
    ckpt.atomic_write_json(res, os.path.join(args.out, "results.json"))
    text = rep.markdown(res, spec, wall_seconds=None if args.report_only else wall)
    ckpt.atomic_write_bytes(os.path.join(args.out, "results.md"), text.encode())
    experiment_plots.plot_at_k(data, names, os.path.join(args.out, "pass_max_at_k.png"))
    experiment_plots.plot_curves(res, os.path.join(args.out, "curves_vs_samples.png"))
    for kind in ("pass", "max"):
        experiment_plots.plot_per_arm(data, names, os.path.join(args.out, f"{kind}_at_k_by_arm.png"),
                                      kind)
    an = spec.get("analysis", {})
    if an.get("offpolicy_reuse"):
        experiment_plots.plot_curves(res, os.path.join(args.out, "curves_offpolicy.png"),
                                     arms=[an.get("offpolicy_one_epoch"), *an["offpolicy_reuse"]])
    if an.get("grpo"):
        experiment_plots.plot_diff_vs_reference(data, names, an["grpo"],
                                                os.path.join(args.out, "diff_vs_grpo.png"))
    print(text)
    return 1 if failed else 0


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def collect(runs: str, arms, seeds, steps: int) -> dict:
    """Final evals per arm, and the warm start's evals: every run evaluates the shared warm start
    at step 0 with its own sampling seed, so their spread is the evaluation's own noise."""
    base = _read_json(os.path.join(runs, "warmstart", "summary.json"))["final"]
    ks = sorted(int(key.split("@")[1]) for key in base if key.startswith("pass@"))
    out = {"ks": ks, "arms": {}}
    # runs with the same seed evaluate the warm start with the same sampling seed: keep one each
    step0 = {_read_json(os.path.join(runs, "warmstart", "summary.json")).get("seed"): base}
    for arm in arms:
        label, estimator, flags = parse_arm(arm)
        finals = []
        for seed in seeds:
            name = f"{estimator}{''.join(f.replace('--', '_').replace('=', '') for f in flags)}-s{seed}"
            path = os.path.join(runs, name, "summary.json")
            if os.path.exists(path) and _finished(os.path.join(runs, name), steps):
                summary = _read_json(path)
                finals.append(summary["final"])
                if summary.get("initial") and summary["initial"]["step"] == 0:
                    step0.setdefault(summary.get("seed"), summary["initial"])
        out["arms"][label] = {"seeds": len(finals), "finals": finals}
    out["warm_start_evals"] = [step0[key] for key in sorted(step0, key=str)]
    return out


def _mean_sd(values):
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def results_table(results: dict) -> str:
    ks = results["ks"]
    show = [k for k in ks if k in (1, 4, max(ks))] or ks
    cols = [f"pass@{k}" for k in show] + [f"max@{k}" for k in show] + ["reward_mean"]
    lines = ["| arm | seeds | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    evals0 = results["warm_start_evals"]
    cells = []
    for c in cols:
        m, s = _mean_sd([e[c] for e in evals0])
        cells.append(f"{m:.3f} ± {s:.3f}")
    lines.append(f"| warm start (before RL; {len(evals0)} evals) | - | " + " | ".join(cells) + " |")
    for label, arm in results["arms"].items():
        cells = []
        for c in cols:
            m, s = _mean_sd([f[c] for f in arm["finals"]])
            cells.append(f"{m:.3f} ± {s:.3f}")
        lines.append(f"| {label} | {arm['seeds']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Mean ± sample standard deviation over seeds, on the same held-out prompts "
                 f"({evals0[0]['num_prompts']} prompts, pass@k / max@k by the unbiased estimators). "
                 "The warm-start row is the same model evaluated with a different sampling seed "
                 "(one per seed) at step 0: its spread is the evaluation's own noise.")
    return "\n".join(lines) + "\n"


def plot_results(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = results["ks"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("pass", "max")):
        stats = [_mean_sd([e[f"{metric}@{k}"] for e in results["warm_start_evals"]]) for k in ks]
        ax.plot(ks, [m for m, _ in stats], "k--", marker="o", label="warm start (before RL)")
        ax.fill_between(ks, [m - s for m, s in stats], [m + s for m, s in stats], color="k",
                        alpha=0.1)
        for label, arm in results["arms"].items():
            if not arm["finals"]:
                continue
            stats = [_mean_sd([f[f"{metric}@{k}"] for f in arm["finals"]]) for k in ks]
            means = [m for m, _ in stats]
            sds = [s for _, s in stats]
            line, = ax.plot(ks, means, marker="o", label=f"{label} ({arm['seeds']} seeds)")
            ax.fill_between(ks, [m - s for m, s in zip(means, sds)],
                            [m + s for m, s in zip(means, sds)], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_ylabel(f"{metric}@k")
        ax.set_title(f"{metric}@k after RL (mean ± sd over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(runs: str, arms, seeds, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for arm in arms:
        label, estimator, flags = parse_arm(arm)
        per_seed = []
        for seed in seeds:
            name = f"{estimator}{''.join(f.replace('--', '_').replace('=', '') for f in flags)}-s{seed}"
            mpath = os.path.join(runs, name, "metrics.jsonl")
            if os.path.exists(mpath):
                with open(mpath) as f:
                    per_seed.append([json.loads(line) for line in f if line.strip()])
        if not per_seed:
            continue
        color = None
        for i, records in enumerate(per_seed):
            train = [r for r in records if r["kind"] == "train"]
            evals = [r for r in records if r["kind"] == "eval"]
            kmax = max(int(key.split("@")[1]) for key in evals[-1] if key.startswith("pass@"))
            kw = {"label": label if i == 0 else None, "alpha": 0.8}
            if color:
                kw["color"] = color
            line, = axes[0].plot([r["step"] for r in train], _smooth([r["reward_mean"] for r in train]), **kw)
            color = line.get_color()
            kw["color"] = color
            axes[1].plot([r["step"] for r in evals], [r["pass@1"] for r in evals], marker="o", ms=3, **kw)
            axes[2].plot([r["step"] for r in evals], [r[f"pass@{kmax}"] for r in evals], marker="o", ms=3, **kw)
    axes[0].set_title("training reward (smoothed)")
    axes[1].set_title("eval pass@1")
    axes[2].set_title("eval pass@k, largest k")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(values, width: int = 9):
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


if __name__ == "__main__":
    sys.exit(main())
