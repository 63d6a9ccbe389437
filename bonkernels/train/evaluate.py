"""Evaluation: sample eval_n completions per held-out prompt, report unbiased pass@k and max@k.

pass@k counts a completion as correct when it passes every hidden test (reward 1.0); max@k uses
the continuous reward (fraction of tests passed). Both come from ``bk.pass_at_k`` /
``bk.max_at_k``, averaged over prompts, for k = 1, 2, 4, ... up to eval_n (and eval_n itself).
Sampling uses its own seeded RNG stream, so evaluating never changes the training run.
"""

from __future__ import annotations

import torch

import bonkernels as bk

from .rollout import sample


def eval_ks(eval_n: int) -> list[int]:
    ks, k = [], 1
    while k <= eval_n:
        ks.append(k)
        k *= 2
    if ks[-1] != eval_n:
        ks.append(eval_n)
    return ks


def metrics_from_rewards(rewards: torch.Tensor, ks) -> dict:
    """rewards: [G, n] fractions in [0, 1] -> {"pass@k": ..., "max@k": ..., "reward_mean": ...}."""
    rewards = rewards.to(torch.float64)
    correct = rewards >= 1.0
    out = {"reward_mean": float(rewards.mean()), "num_prompts": int(rewards.shape[0])}
    for k in ks:
        out[f"pass@{k}"] = float(bk.pass_at_k(correct, k).mean())
        out[f"max@{k}"] = float(bk.max_at_k(rewards, k).mean())
    return out


def evaluate(model, tokenizer, task, problems, *, eval_n: int, device, dist, seed: int,
             prompts_per_batch: int = 32, return_rewards: bool = False):
    """The metrics dict; with return_rewards, (metrics, rewards) where rewards is the [G, eval_n]
    float64 table of per-completion rewards in the order of ``problems`` (the same on every rank)."""
    mine = dist.shard(list(enumerate(problems)))
    rows = []
    devices = [device] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(mine), prompts_per_batch):
            chunk = mine[start:start + prompts_per_batch]
            batch = [p for _, p in chunk]
            roll = sample(model, tokenizer, [p.prompt for p in batch], eval_n,
                          task.max_new_tokens, device)
            expanded = [p for p in batch for _ in range(eval_n)]
            rewards = task.rewards(expanded, roll.texts)
            for j, (index, _) in enumerate(chunk):
                rows.append((index, rewards[j * eval_n:(j + 1) * eval_n]))
    gathered = sorted(r for part in dist.all_gather_objects(rows) for r in part)
    table = torch.tensor([r for _, r in gathered], dtype=torch.float64)
    metrics = metrics_from_rewards(table, eval_ks(eval_n))
    return (metrics, table) if return_rewards else metrics


def write_eval_rewards(path: str, *, step: int, samples: int, problems, rewards: torch.Tensor) -> None:
    """One evaluation's per-prompt rewards as JSON (for paired tests over prompts):
    {"step", "samples", "keys": [problem key per row], "rewards": [[eval_n rewards] per prompt]}."""
    from . import checkpoint as ckpt

    ckpt.atomic_write_json({"step": step, "samples": samples, "keys": [p.key for p in problems],
                            "rewards": rewards.tolist()}, path)
