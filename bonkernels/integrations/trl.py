"""bonkernels advantages in TRL's ``GRPOTrainer``.

Swap the trainer class and name the estimator::

    from bonkernels.integrations.trl import BonkernelsGRPOTrainer
    trainer = BonkernelsGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
                                    train_dataset=..., estimator="maxk_loo1", k=4)

Everything else is TRL's: generation, reward functions, the loss (``loss_type``), logging. After TRL
has scored a generation batch, the advantages of every group of ``num_generations`` completions
are recomputed with ``bonkernels.advantages`` from the same rewards (the weighted sum over reward
functions, as TRL's default ``multi_objective_aggregation="sum_then_normalize"``); completions no
reward function could score keep advantage 0, as in TRL. With ``estimator="grpo"`` and TRL's
defaults (``scale_rewards="group"``, eps 1e-4) the advantages are TRL's own. TRL's
``scale_rewards`` is not consulted: the estimator decides the scale (``estimator="dr_grpo"`` is
TRL's ``scale_rewards="none"``).

If you already subclass ``GRPOTrainer``, add :class:`BonkernelsAdvantagesMixin` in front of it
instead. The off-policy estimators need the current policy's log-probs at loss time; use
``bonkernels.policy_loss`` in your own loss for those.
"""

from __future__ import annotations

from typing import Optional

import torch
from trl import GRPOTrainer

from .. import validation
from ..ops import advantages as _advantages
from ..tables import MIXABLE_ESTIMATORS, normalize_k_weights, parse_k_weights


class BonkernelsAdvantagesMixin:
    """Replaces the advantages a TRL GRPO trainer computes by a bonkernels estimator's."""

    def __init__(self, *args, estimator: str = "maxk_loo1", k: Optional[int] = None, scale: str = "mean",
                 eps: float = 1e-4, advantage_kwargs: Optional[dict] = None, k_weights=None, **kwargs):
        validation.check_trainer_estimator(estimator, "TRL (advantages once per generation batch)", k=k,
                                           k_weights=k_weights, scale=scale, eps=eps)
        if k_weights is not None:
            if isinstance(k_weights, str):
                k_weights = parse_k_weights(k_weights)
            if estimator not in MIXABLE_ESTIMATORS:
                raise ValueError(f"k_weights (a mixture over k) does not apply to {estimator!r}; mixtures run "
                                 f"for {', '.join(MIXABLE_ESTIMATORS)}")
            k_weights = normalize_k_weights(k_weights)
        self.bk_estimator = estimator
        self.bk_k = None if k is None or k_weights is not None else k
        self.bk_k_weights = k_weights
        self.bk_scale = scale
        self.bk_eps = eps
        self.bk_advantage_kwargs = dict(advantage_kwargs or {})
        self.bk_trl_advantages = None     # TRL's own advantages of the last batch (this process)
        self._bk_rewards_per_func = None
        super().__init__(*args, **kwargs)
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("bonkernels estimators take one reward per completion: use "
                             "multi_objective_aggregation='sum_then_normalize' (TRL's default)")

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # [num completions of all processes, num reward funcs], the rewards TRL normalises next
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._bk_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._bk_rewards_per_func = self._bk_rewards_per_func, None
        if rewards_per_func is None:
            raise RuntimeError("TRL did not call _calculate_rewards; this TRL version is not supported")
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        weights = self.reward_weights.to(rewards_per_func.device)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        with torch.no_grad():
            adv = _advantages(rewards.to(torch.float64).view(-1, num_generations), self.bk_k, self.bk_estimator,
                              k_weights=self.bk_k_weights, scale=self.bk_scale, eps=self.bk_eps,
                              **self.bk_advantage_kwargs).reshape(-1)
        adv = torch.where(unscorable, torch.zeros_like(adv), adv)

        local = output["advantages"]
        n_local = local.shape[0]
        start = self.accelerator.process_index * n_local
        self.bk_trl_advantages = local
        output["advantages"] = adv[start:start + n_local].to(device=local.device, dtype=local.dtype)
        self._bk_replace_logged_advantages(adv)
        return output

    def _bk_replace_logged_advantages(self, adv: torch.Tensor) -> None:
        """TRL logged its own advantages for this batch; log ours instead."""
        logged = getattr(self, "_logs", {}).get("advantages")
        if logged is None or len(logged) < adv.numel():
            return
        for _ in range(adv.numel()):
            logged.pop()
        logged.extend(adv.tolist())


class BonkernelsGRPOTrainer(BonkernelsAdvantagesMixin, GRPOTrainer):
    """``trl.GRPOTrainer`` whose advantages come from a bonkernels estimator.

    Extra keyword arguments: ``estimator`` (default ``"maxk_loo1"``), ``k`` or ``k_weights`` (a
    mixture over k: weights for k = 1..T, or ``"harmonic:T"``; docs/spec.md section 12), ``scale``
    (``"mean"``, GRPO's scale, or ``"sum"``), ``eps`` (the std eps of the z-scored estimators;
    1e-4 as TRL) and ``advantage_kwargs`` (more ``bonkernels.advantages`` options).
    """
