"""Variance of the policy-gradient estimate at a fixed policy, for several estimators.

    python -m bonkernels.train.experiment_gradvar --config EXPERIMENT.json --runs RUNS

At the shared warm start (no optimiser step anywhere), R batches are drawn (fresh training
prompts and fresh samples each, seeded); every estimator of the comparison gets the *same*
batches (common random numbers), and the full flattened gradient of the driver's loss (the
same ``bk.policy_loss`` call as a training step's first epoch, before clipping) is kept. From the
R gradients g_r of one estimator:

* total variance  tr Cov = sum_r ||g_r - mean||^2 / (R - 1);
* squared norm of the mean ||mean||^2, and the relative variance tr Cov / ||mean||^2, which does
  not depend on the estimator's scale (two estimators of the same objective may differ by a
  constant factor; the relative variance compares their noise at equal signal);
* a bootstrap over the R batches (exact, from the Gram matrix of the gradients) of the ratio of
  two estimators' relative variances, and the cosine between their mean gradients.

With "extra_rewards": ["binary"] the same batches are also scored with the all-tests-passed 0/1
reward (on 0/1 rewards MaxRL's one-liner and the harmonic mixture target the same objective, so
the comparison is exactly the one of the estimator specification); every (estimator, reward) pair
gets its statistics and each reward its ratio ("by_reward").

Writes RUNS/gradvar/gradvar.json. The experiment runs it as one of its jobs (one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch


def gram(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """[R, D] x [R, D] -> [R, R] float64 inner products (computed in float64 column chunks)."""
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for start in range(0, a.shape[1], 1 << 18):
        out += a[:, start:start + (1 << 18)].double() @ b[:, start:start + (1 << 18)].double().T
    return out.numpy()


def variance_stats(K: np.ndarray, counts: np.ndarray | None = None) -> dict:
    """From the Gram matrix K of R gradients (and optional bootstrap counts c, summing to R):
    trace of the covariance, squared norm of the mean, relative variance."""
    R = K.shape[0]
    c = np.ones(R) if counts is None else counts
    mean_sq = float(c @ K @ c) / R ** 2
    trace = (float(c @ np.diag(K)) - R * mean_sq) / (R - 1)
    # ||mean||^2 overestimates ||E g||^2 by tr Cov / R; the unbiased estimate is reported too
    return {"trace_cov": trace, "mean_sq_norm": mean_sq, "mean_sq_norm_unbiased": mean_sq - trace / R,
            "rel_var": trace / mean_sq if mean_sq > 0 else float("inf")}


def compare_variance(grads: dict, num: str, den: str, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per estimator statistics, the ratio rel_var[num] / rel_var[den] with a 95% bootstrap
    interval over batches (the same resampled batches for both: they are paired), and the
    cosine of the two mean gradients. grads: {name: [R, D] tensor}, the same batches in order."""
    Ks = {name: gram(g, g) for name, g in grads.items()}
    R = next(iter(Ks.values())).shape[0]
    out = {"arms": {name: variance_stats(K) for name, K in Ks.items()}}
    cross = gram(grads[num], grads[den])
    dot = float(cross.sum()) / R ** 2
    out["cosine"] = dot / np.sqrt(out["arms"][num]["mean_sq_norm"] * out["arms"][den]["mean_sq_norm"])
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(n_boot):
        c = np.bincount(rng.integers(0, R, R), minlength=R).astype(np.float64)
        a, b = variance_stats(Ks[num], c), variance_stats(Ks[den], c)
        ratios.append(a["rel_var"] / b["rel_var"] if b["rel_var"] > 0 else float("inf"))
    lo, hi = np.quantile(ratios, [0.025, 0.975])  # a resample of one repeated batch: variance 0
    out["ratio"] = {"num": num, "den": den,
                    "value": out["arms"][num]["rel_var"] / out["arms"][den]["rel_var"],
                    "lo": float(lo), "hi": float(hi), "n_boot": n_boot}
    return out


def collect_gradients(model, tokenizer, task, arm_cfgs: dict, *, repeats: int, batch_size: int,
                      n: int, seed: int, device="cpu", log=print) -> dict:
    """{name: [R, D] float32 tensor}: the flattened gradient of each arm's loss on R shared
    batches at the model's current (fixed) parameters."""
    from .rollout import sample, token_logprobs
    from .scoring import safe_rewards
    from .trainer import _policy_loss, k_at, k_weights_at, weighting_for

    loss_fn = _policy_loss()
    params = [p for p in model.parameters() if p.requires_grad]
    D = sum(p.numel() for p in params)
    grads = {name: torch.zeros(repeats, D, dtype=torch.float32) for name in arm_cfgs}
    t0 = time.time()
    for r in range(repeats):
        problems = [task.problem("train", f"gradvar-{seed}-{r}-{j}") for j in range(batch_size)]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + r)
            roll = sample(model, tokenizer, [p.prompt for p in problems], n, task.max_new_tokens,
                          device)
        fractions, _ = safe_rewards(task, [p for p in problems for _ in range(n)], roll.texts)
        model.train()
        with torch.no_grad():
            old_logp = token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        for name, cfg in arm_cfgs.items():
            rewards = torch.tensor(fractions, dtype=torch.float64, device=device)
            if cfg.reward == "binary":
                rewards = (rewards >= 1.0).to(torch.float64)
            k_weights = k_weights_at(1, cfg)
            mix = {} if k_weights is None else {"k_weights": k_weights}
            model.zero_grad(set_to_none=True)
            logp = token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
            loss, _ = loss_fn(logp, old_logp, rewards, None if k_weights is not None else k_at(1, cfg),
                              cfg.estimator, mask=roll.completion_mask, **mix, group_size=n,
                              clip_eps=cfg.clip_eps, clamp_delta=cfg.clamp_delta,
                              weighting=weighting_for(cfg), loss_agg=cfg.loss_agg)
            loss.backward()
            grads[name][r] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                        .reshape(-1).float().cpu() for p in params])
        if (r + 1) % 8 == 0 or r + 1 == repeats:
            log(f"gradvar: {r + 1}/{repeats} batches ({time.time() - t0:.0f} s)")
    model.zero_grad(set_to_none=True)
    return grads


def main(argv=None) -> int:
    from . import checkpoint as ckpt
    from .cli import parse_args
    from .experiment_report import arm_by_name, flags_to_argv
    from .tasks import make_task
    from .trainer import _prepare_model, validate

    p = argparse.ArgumentParser(prog="python -m bonkernels.train.experiment_gradvar",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the experiment config (JSON)")
    p.add_argument("--runs", required=True, help="the experiment's run directory")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with open(args.config) as f:
        spec = json.load(f)
    gv = spec["analysis"]["gradvar"]
    train_config = os.path.join(args.runs, "train_config.json")
    cache = os.path.join(args.runs, "warmstart-cache")
    cfgs = {}
    base_reward = parse_args(["--config", train_config]).reward
    rewards = list(dict.fromkeys([base_reward, *gv.get("extra_rewards", [])]))
    for reward in rewards:  # the same batches scored both ways: e.g. "binary" besides "fraction"
        for name in gv["arms"]:
            arm = arm_by_name(spec, name)
            key = name if reward == base_reward else f"{name} [{reward} reward]"
            cfgs[key] = parse_args(["--config", train_config, "--warmstart-cache", cache,
                                    "--estimator", arm["estimator"],
                                    *flags_to_argv(arm.get("flags", {})), "--reward", reward])
            validate(cfgs[key])
    first = next(iter(cfgs.values()))
    n = int(gv.get("n", first.n))
    batch_size = int(gv.get("batch_size", first.batch_size))
    for name, cfg in cfgs.items():
        if cfg.n != n:
            raise ValueError(f"gradvar: arm {name!r} has n = {cfg.n}, not {n}")
    task = make_task(first.task, seed=first.task_seed, synth_depth_weights=first.synth_depth_weights)
    if first.max_new_tokens:
        task.max_new_tokens = first.max_new_tokens

    class _Single:  # _prepare_model's view of a one-process run
        is_main, device = True, "cpu"

        def broadcast_module(self, module):
            pass

    model, tokenizer = _prepare_model(first, task, _Single(), print)
    t0 = time.time()
    grads = collect_gradients(model, tokenizer, task, cfgs, repeats=int(gv.get("repeats", 32)),
                              batch_size=batch_size, n=n, seed=int(gv.get("seed", 0)))
    names = list(gv["arms"])
    n_boot = int(gv.get("n_boot", 2000))
    out = compare_variance({k: grads[k] for k in names}, names[-1], names[0], n_boot=n_boot)
    out["by_reward"] = {base_reward: {"ratio": out["ratio"], "cosine": out["cosine"]}}
    for reward in rewards[1:]:
        keys = [f"{name} [{reward} reward]" for name in names]
        extra = compare_variance({k: grads[k] for k in keys}, keys[-1], keys[0], n_boot=n_boot)
        out["arms"].update(extra["arms"])
        out["by_reward"][reward] = {"ratio": extra["ratio"], "cosine": extra["cosine"]}
    out.update(spec=gv, repeats=int(gv.get("repeats", 32)), batch_size=batch_size, n=n,
               reward=first.reward, seconds=time.time() - t0)
    os.makedirs(os.path.join(args.runs, "gradvar"), exist_ok=True)
    ckpt.atomic_write_json(out, os.path.join(args.runs, "gradvar", "gradvar.json"))
    print(json.dumps({k: v for k, v in out.items() if k != "arms"}, indent=1))
    for name, v in out["arms"].items():
        print(f"{name}: {v}")
    task.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
