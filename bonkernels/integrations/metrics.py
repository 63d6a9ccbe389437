"""Unbiased pass@k / max@k for a validation batch, as trainers hold it.

A validation batch is one reward per sample plus one group id per sample (the prompt's uid in
verl, the position's group of ``num_generations`` in TRL). For every k asked for, the per-group
unbiased estimators (``bonkernels.pass_at_k``: 1 - C(n-c, k)/C(n, k); ``bonkernels.max_at_k``: the
mean over all k-subsets of the subset's best reward) are averaged over the groups. Unlike a
bootstrap (resampling k of the n samples with replacement), they are exact expectations given the
samples: one correct sample in four gives pass@4 = 1.

The mixed metric for k weights w_1..w_T is sum_k w_k max@k (and sum_k w_k pass@k for binary
rewards); it is computed by linearity from the single-k metrics.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence

import numpy as np
import torch

from ..ops import max_at_k, pass_at_k


def dense_group_ids(group_ids, n: int) -> torch.Tensor:
    """Any per-sample group ids (strings, uuids, numbers; numpy, list or tensor) -> int64 ids 0..G-1."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.detach().cpu().numpy()
    arr = np.asarray(group_ids)
    if arr.shape != (n,):
        raise ValueError(f"group_ids must hold one id per sample ({n}), got shape {arr.shape}")
    _, inverse = np.unique(arr, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.int64)


def default_ks(min_group_size: int) -> list:
    """1, 2, 4, ... up to the smallest group's size, which is always included."""
    ks, k = [], 1
    while k < min_group_size:
        ks.append(k)
        k *= 2
    ks.append(max(min_group_size, 1))
    return ks


def is_binary(rewards: torch.Tensor) -> bool:
    return bool(((rewards == 0) | (rewards == 1)).all())


def mixed_name(kind: str, k_weights: Sequence[float]) -> str:
    """``max_mix@T`` with T the largest k of non-zero weight (the form verl's log parser expects)."""
    return f"{kind}_mix@{largest_k(k_weights)}"


def per_group_metrics(rewards, group_ids, ks: Optional[Iterable[int]] = None, *,
                      k_weights: Optional[Sequence[float]] = None, correct=None,
                      small_groups: str = "error") -> Dict[str, torch.Tensor]:
    """``{"pass@k": [G], "max@k": [G], "max_mix@T": [G], ...}`` per group (ascending group id).

    Args:
        rewards: ``[N]`` one reward per sample (any float; bool or integer are taken as 0/1).
        group_ids: ``[N]`` group id per sample, any hashable values, in any order.
        ks: the k to report (default: 1, 2, 4, ... and the smallest group's size).
        k_weights: weights of k = 1..T for the mixed metric ``max_mix@T`` = sum_k w_k max@k.
        correct: ``[N]`` 0/1 correctness for pass@k. Default: the rewards when they are all 0/1;
            otherwise pass@k is not reported (max@k is the metric of graded rewards).
        small_groups: a group smaller than k: ``"error"`` (default, names the group), ``"clamp"``
            (use k = the group's size) or ``"zero"`` (report 0 for it), as ``bonkernels.max_at_k``.
    """
    rewards = _as_float_tensor(rewards, "rewards")
    gid = dense_group_ids(group_ids, rewards.numel())
    if rewards.numel() == 0:
        raise ValueError("an empty validation batch has no pass@k or max@k")
    if correct is None and is_binary(rewards):
        correct = rewards
    if correct is not None:
        correct = _as_float_tensor(correct, "correct")
        if correct.shape != rewards.shape:
            raise ValueError(f"correct must have the rewards' shape {tuple(rewards.shape)}, got {tuple(correct.shape)}")
    sizes = torch.bincount(gid)
    ks = sorted(set(int(k) for k in (default_ks(int(sizes.min())) if ks is None else ks)))
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {ks}")
    if k_weights is not None:
        weights = _check_weights(k_weights)
        ks_needed = sorted(set(ks) | {k for k, w in enumerate(weights, start=1) if w != 0})
    else:
        weights, ks_needed = None, ks

    single = {}
    for k in ks_needed:
        single[f"max@{k}"] = max_at_k(rewards, k, group_ids=gid, small_groups=small_groups)
        if correct is not None:
            single[f"pass@{k}"] = pass_at_k(correct, k, group_ids=gid, small_groups=small_groups)
    out = {name: v for name, v in single.items() if int(name.split("@")[1]) in ks}
    if weights is not None:
        for kind in ("max", "pass") if correct is not None else ("max",):
            mixed = torch.zeros(sizes.numel(), dtype=torch.float64)
            for k, w in enumerate(weights, start=1):
                if w != 0:
                    mixed = mixed + w * single[f"{kind}@{k}"].double()
            out[mixed_name(kind, weights)] = mixed
    return out


def validation_metrics(rewards, group_ids, ks: Optional[Iterable[int]] = None, *,
                       k_weights: Optional[Sequence[float]] = None, correct=None,
                       small_groups: str = "error") -> Dict[str, float]:
    """The batch's metrics: :func:`per_group_metrics` averaged over the groups (each group counts once)."""
    per_group = per_group_metrics(rewards, group_ids, ks, k_weights=k_weights, correct=correct,
                                  small_groups=small_groups)
    return {name: float(v.double().mean()) for name, v in per_group.items()}


def _as_float_tensor(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).detach().cpu().reshape(-1)
    if t.dtype == torch.bool or not t.is_floating_point():
        t = t.to(torch.float64)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contain NaN or inf")
    return t


def _check_weights(k_weights) -> list:
    weights = [float(w) for w in (k_weights.tolist() if isinstance(k_weights, torch.Tensor) else k_weights)]
    if not weights or any(not np.isfinite(w) or w < 0 for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"k_weights must be finite, non-negative, for k = 1..T, with one > 0; got {weights}")
    return weights


def largest_k(k_weights) -> int:
    """The largest k of non-zero weight."""
    weights = _check_weights(k_weights)
    return max(k for k, w in enumerate(weights, start=1) if w > 0)
