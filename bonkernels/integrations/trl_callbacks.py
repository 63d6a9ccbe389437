"""Unbiased pass@k / max@k of TRL's GRPO evaluation, logged with its metrics.

::

    from bonkernels.integrations.trl_callbacks import PassAtKCallback
    trainer.add_callback(PassAtKCallback(trainer, ks=[1, 2, 4]))

During ``trainer.evaluate()`` (or the evaluations of ``eval_strategy``), the callback keeps the
reward of every evaluation completion (the weighted sum over reward functions, as TRL's own
reward) in its group of ``num_generations_eval``; at the end of the evaluation it adds
``eval_pass@k`` (when every reward is 0/1), ``eval_max@k`` and, with ``k_weights``,
``eval_max_mix@T`` to the returned metrics and logs them (``bonkernels.integrations.metrics``).
Works with ``trl.GRPOTrainer`` and its subclasses, e.g. ``BonkernelsGRPOTrainer``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from transformers import TrainerCallback

from .metrics import validation_metrics


class PassAtKCallback(TrainerCallback):
    """Adds unbiased pass@k / max@k of the evaluation completions to a GRPO trainer's eval metrics.

    Args:
        trainer: the GRPO trainer (its reward computation is observed, nothing else changes).
        ks: the k to report (default 1, 2, 4, ... up to ``num_generations_eval``).
        k_weights: weights of k = 1..T: also report ``max_mix@T`` = sum_k w_k max@k.
        small_groups: a group smaller than k: ``"clamp"`` (default: k = its size), ``"zero"``, ``"error"``.
    """

    def __init__(self, trainer, ks: Optional[Sequence[int]] = None, k_weights: Optional[Sequence[float]] = None,
                 small_groups: str = "clamp"):
        if not hasattr(trainer, "_calculate_rewards") or not hasattr(trainer, "num_generations_eval"):
            raise TypeError("PassAtKCallback needs a trl.GRPOTrainer (or subclass)")
        self.trainer = trainer
        self.ks = None if ks is None else [int(k) for k in ks]
        self.k_weights = None if k_weights is None else [float(w) for w in k_weights]
        self.small_groups = small_groups
        self._rewards, self._group_ids, self._groups = [], [], 0
        self.last_rewards = self.last_group_ids = None   # the last evaluation's inputs (for inspection)
        calculate = trainer._calculate_rewards

        def calculate_and_record(*args, **kwargs):
            rewards_per_func = calculate(*args, **kwargs)
            if not trainer.model.training:
                self._record(rewards_per_func)
            return rewards_per_func

        trainer._calculate_rewards = calculate_and_record

    def _record(self, rewards_per_func: torch.Tensor) -> None:
        # [completions of all processes, reward functions] -> one reward each, as TRL sums them
        weights = self.trainer.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1).detach().cpu().double()
        n = self.trainer.num_generations_eval
        if rewards.numel() % n:
            raise ValueError(f"{rewards.numel()} evaluation completions do not split into groups of "
                             f"num_generations_eval = {n}")
        groups = rewards.numel() // n
        self._rewards.append(rewards)
        self._group_ids.append(torch.arange(self._groups, self._groups + groups).repeat_interleave(n))
        self._groups += groups

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self._rewards:
            return
        rewards, group_ids = torch.cat(self._rewards), torch.cat(self._group_ids)
        self._rewards, self._group_ids, self._groups = [], [], 0
        self.last_rewards, self.last_group_ids = rewards, group_ids
        values = validation_metrics(rewards, group_ids, self.ks, k_weights=self.k_weights,
                                    small_groups=self.small_groups)
        named = {f"eval_{name}": value for name, value in values.items()}
        if metrics is not None:
            metrics.update(named)
        self.trainer.log(dict(named))
