"""bonkernels advantage estimators for verl.

Each estimator has verl's advantage-estimator signature
``fn(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,
config=None, **kwargs) -> (advantages, returns)``: the sequence reward is the sum of the token-level
rewards, ``index`` holds one group id per sample (verl's ``uid``, any hashable values), and both
outputs are ``[bs, response_length]`` (the per-sequence advantage on every response token).

Importing this module registers every estimator in verl's registry as ``bk_<name>`` (when verl is
importable), so a verl run switches with ``algorithm.adv_estimator=bk_maxk_loo1``; import it in the
process that runs the trainer. ``k`` and the other settings are read, in this order, from the
algorithm config (keys ``bk_k``, ``bk_scale``, ``bk_k_weights``, when the config has them), from
:func:`configure`, and from the environment (``BONKERNELS_K``, ``BONKERNELS_SCALE``,
``BONKERNELS_K_WEIGHTS``, which reach Ray workers when set in the job's environment).

A mixture over k (docs/spec.md section 12) replaces k: ``bk_k_weights`` / ``configure(k_weights=)``
/ ``BONKERNELS_K_WEIGHTS`` take a list of weights for k = 1..T or the spellings ``harmonic:T`` (MaxRL's
truncation of order T) and ``uniform:T``; when set, k is not used. ``bk_maxrl`` (MaxRL's
(r - mean) / mean) needs neither.

Conventions (docs/conventions.md): advantages are in the ``mean`` scale by default, like GRPO's.
``grpo`` is verl's GRPO (``norm_adv_by_std_in_grpo=False`` gives ``dr_grpo``, verl's unscaled
version); ``tang_loo`` with ``scale="sum"`` is verl's ``grpo_passk`` (max minus second max on the
unique best sample, divided by the group's std + epsilon when ``norm_adv_by_std_in_grpo``). Other
estimators are never divided by the std: that would bias the unbiased ones. A group of one sample
gets advantage 0 (verl's GRPO gives it its raw score). The off-policy estimators need the current
policy's log-probs, which verl's advantage step does not have: use ``bonkernels.policy_loss``.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch

from .. import estimators, validation
from ..ops import advantages as _advantages
from ..tables import MIXABLE_ESTIMATORS, normalize_k_weights, parse_k_weights

PREFIX = "bk_"
_SETTINGS = {"k": None, "scale": None, "k_weights": None}


def configure(k: Optional[int] = None, scale: Optional[str] = None, k_weights=None) -> None:
    """Process-wide defaults for the registered ``bk_*`` estimators (``k_weights``: a sequence of
    weights for k = 1..T, or a string ``harmonic:T`` / ``uniform:T`` / ``w1,w2,...``)."""
    if k is not None:
        _SETTINGS["k"] = k
    if scale is not None:
        _SETTINGS["scale"] = scale
    if k_weights is not None:
        _SETTINGS["k_weights"] = _weights(k_weights)


def _weights(value):
    """k weights from a config value: a string spelling or a sequence of numbers."""
    if isinstance(value, str):
        return parse_k_weights(value)
    return normalize_k_weights(list(value))


def compute_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, *,
                      estimator: str = "maxk_loo1", k: Optional[int] = None, k_weights=None,
                      scale: str = "mean",
                      epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                      std_normalize: Optional[bool] = None, **advantage_kwargs):
    """Advantages and returns ``[bs, T]`` for verl from any bonkernels estimator.

    Args:
        token_level_rewards: ``[bs, T]``; the sequence reward is the sum over tokens.
        response_mask: ``[bs, T]`` 0/1.
        index: ``[bs]`` group ids (numpy array, list or tensor of any hashable values).
        estimator: a name from ``bonkernels.ESTIMATORS`` (not the off-policy ones).
        k: the pass@k / max@k target; required by the estimators that use k (unless k_weights).
        k_weights: a mixture over k (weights for k = 1..T), instead of k.
        scale: ``"mean"`` (default, GRPO's scale) or ``"sum"`` (the spec's).
        epsilon: added to the std (GRPO's eps; also ``bonkernels.advantages(eps=...)``).
        norm_adv_by_std_in_grpo: verl's switch: ``grpo`` becomes ``dr_grpo`` when False; it also
            decides ``std_normalize`` for ``tang_loo`` (as verl's ``grpo_passk``).
        std_normalize: divide by the group's sample std + epsilon (None: only ``tang_loo``, and
            only when ``norm_adv_by_std_in_grpo``).
        **advantage_kwargs: passed to ``bonkernels.advantages`` (``clip``, ``small_groups``, ...).
    """
    validation.check_trainer_estimator(estimator, "verl", scale=scale, eps=epsilon, check_k_given=False)
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
        raise ValueError("token_level_rewards must be a 2-D [bs, response_length] tensor")
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"response_mask must have the shape of token_level_rewards "
                         f"{tuple(token_level_rewards.shape)}, got {tuple(response_mask.shape)}")
    if index is None:
        raise ValueError("verl's index (the per-sample uid) is required to group the samples")
    bs = token_level_rewards.shape[0]
    group_ids = group_ids_from_index(index, bs, token_level_rewards.device)
    if k_weights is not None:
        k = None
    validation.check_trainer_estimator(estimator, "verl", k=k, k_weights=k_weights,
                                       k_hint="pass k=, set algorithm.bk_k, call "
                                       "bonkernels.integrations.verl.configure(k=...) or set BONKERNELS_K")
    if estimator == "grpo" and not norm_adv_by_std_in_grpo:
        estimator = "dr_grpo"
    if std_normalize is None:
        std_normalize = estimator == "tang_loo" and norm_adv_by_std_in_grpo

    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1).to(torch.float64)
        if k_weights is not None:
            advantage_kwargs["k_weights"] = k_weights
        adv = _advantages(scores, None if k is None else int(k), estimator, group_ids=group_ids, scale=scale,
                          eps=epsilon, **advantage_kwargs)
        if std_normalize:
            adv = adv / (_group_sample_std(scores, group_ids) + epsilon)
        adv = adv.to(token_level_rewards.dtype)[:, None] * response_mask
    return adv, adv


def group_ids_from_index(index, bs: int, device) -> torch.Tensor:
    """verl's uid array (strings or numbers) -> int64 group ids [bs]."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index)
    if arr.shape != (bs,):
        raise ValueError(f"index must hold one group id per sample ({bs}), got shape {arr.shape}")
    _, inverse = np.unique(arr, return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.int64, device=device)


def _group_sample_std(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Each sample's group sample std (n - 1); 1 for a group of one (its advantage is 0 anyway)."""
    G = int(group_ids.max()) + 1 if group_ids.numel() else 0
    count = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, group_ids, torch.ones_like(scores))
    total = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, group_ids, scores)
    mean = total / count.clamp(min=1)
    centered = scores - mean[group_ids]
    ss = torch.zeros(G, dtype=scores.dtype, device=scores.device).index_add_(0, group_ids, centered * centered)
    std = torch.sqrt(ss / (count - 1).clamp(min=1))
    return torch.where(count[group_ids] > 1, std[group_ids], torch.ones_like(scores))


def _setting(config, key: str, env: str, default=None):
    value = None
    if config is not None:
        try:
            value = config.get("bk_" + key, None)
        except (AttributeError, TypeError):
            value = None
    if value is None:
        value = _SETTINGS[key]
    if value is None:
        value = os.environ.get(env)
    return default if value is None else value


def make_estimator(estimator: str):
    """The verl-signature function for one bonkernels estimator (settings read at call time)."""
    estimators.get(estimator)

    def bonkernels_advantage(token_level_rewards, response_mask, index=None, epsilon: float = 1e-6,
                             norm_adv_by_std_in_grpo: bool = True, config=None, **kwargs):
        k = _setting(config, "k", "BONKERNELS_K")
        k_weights = _setting(config, "k_weights", "BONKERNELS_K_WEIGHTS")
        # a configured mixture applies to the estimators that can mix k; the others keep k
        k_weights = None if k_weights is None or estimator not in MIXABLE_ESTIMATORS else _weights(k_weights)
        scale = _setting(config, "scale", "BONKERNELS_SCALE", "mean")
        norm = norm_adv_by_std_in_grpo
        if config is not None:
            try:
                norm = config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
            except (AttributeError, TypeError):
                pass
        return compute_advantage(token_level_rewards, response_mask, index, estimator=estimator,
                                 k=None if k is None else int(k), k_weights=k_weights, scale=str(scale),
                                 epsilon=epsilon,
                                 norm_adv_by_std_in_grpo=bool(norm))

    bonkernels_advantage.__name__ = f"bonkernels_{estimator}_advantage"
    bonkernels_advantage.__qualname__ = bonkernels_advantage.__name__
    bonkernels_advantage.estimator = estimator
    return bonkernels_advantage


REGISTERED = {}


def register(names=None) -> dict:
    """Register ``bk_<name>`` in verl's advantage-estimator registry; returns {verl name: function}.

    ``names``: estimators to register (default: every on-policy estimator). Raises ImportError
    when verl is not installed. Registering again is a no-op.
    """
    from verl.trainer.ppo import core_algos

    names = names or [e for e in estimators.ESTIMATORS if not estimators.get(e).needs_deltas]
    out = {}
    for name in names:
        verl_name = PREFIX + name
        existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(verl_name)
        if getattr(existing, "estimator", None) == name:   # ours, from an earlier import or reload
            fn = existing
        else:
            fn = REGISTERED.get(verl_name) or make_estimator(name)
        if estimators.get(name).needs_deltas:
            raise ValueError(f"{name} cannot be a verl advantage estimator (it needs the current policy's "
                             "log-probs); use bonkernels.policy_loss")
        core_algos.register_adv_est(verl_name)(fn)
        REGISTERED[verl_name] = fn
        out[verl_name] = fn
    return out


try:  # register on import when verl is there; stay importable without it
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:
    pass
else:
    register()
