"""bonkernels advantage estimators in SkyRL's advantage-estimator registry.

SkyRL chooses its estimator by name (``trainer.algorithm.advantage_estimator``) from
``AdvantageEstimatorRegistry``, and calls it with ``token_level_rewards``, ``response_mask``,
``index`` (one uid per sample), ``grpo_norm_by_std``, ``config`` (the algorithm config) and more.
:func:`register` adds ``bk_<name>`` for every on-policy bonkernels estimator::

    import bonkernels.integrations.skyrl as bk_skyrl
    bk_skyrl.register(k=4)        # then trainer.algorithm.advantage_estimator=bk_maxk_loo1

Register in the driver: SkyRL's registry copies registered functions (with the settings given to
:func:`register`) to its Ray workers. Settings are read, in this order, from the algorithm config
(attributes or keys ``bk_k``, ``bk_k_weights``, ``bk_scale``, when it has them), from
:func:`register`, and from the environment (``BONKERNELS_K``, ``BONKERNELS_K_WEIGHTS``
comma-separated, ``BONKERNELS_SCALE``).

Conventions: the sequence reward is the sum of the token-level rewards; advantages are in the
``mean`` scale by default and sit on every response token. ``bk_grpo`` is SkyRL's ``grpo``
(``grpo_norm_by_std=False``: the unscaled ``dr_grpo``), ``bk_rloo`` SkyRL's ``rloo``. A group of one
sample gets 0 (SkyRL's ``grpo`` gives it its raw score / (1 + epsilon)).
"""

from __future__ import annotations

import inspect
import os
from typing import Optional, Sequence

import torch

from .. import estimators, validation
from ..ops import advantages as _advantages
from .metrics import dense_group_ids

PREFIX = "bk_"


def compute_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, *,
                      estimator: str = "maxk_loo1", k: Optional[int] = None,
                      k_weights: Optional[Sequence[float]] = None, scale: str = "mean",
                      epsilon: float = 1e-6, grpo_norm_by_std: bool = True):
    """``(advantages, returns)``, both ``[bs, T]``, from any on-policy bonkernels estimator."""
    validation.check_trainer_estimator(estimator, "SkyRL", scale=scale, eps=epsilon, check_k_given=False)
    if not isinstance(token_level_rewards, torch.Tensor) or token_level_rewards.dim() != 2:
        raise ValueError("token_level_rewards must be a 2-D [bs, response_length] tensor")
    if response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"response_mask must have the shape of token_level_rewards "
                         f"{tuple(token_level_rewards.shape)}, got {tuple(response_mask.shape)}")
    if index is None:
        raise ValueError("SkyRL's index (one uid per sample) is required to group the samples")
    group_ids = dense_group_ids(index, token_level_rewards.shape[0]).to(token_level_rewards.device)
    if estimator == "grpo" and not grpo_norm_by_std:
        estimator = "dr_grpo"
    kwargs = {"scale": scale, "eps": epsilon, "group_ids": group_ids}
    if k_weights is not None:
        if "k_weights" not in inspect.signature(_advantages).parameters:
            raise ValueError("k_weights needs a bonkernels with mixtures over k (bonkernels.advantages(k_weights=...))")
        kwargs["k_weights"] = [float(w) for w in k_weights]
    else:
        validation.check_trainer_estimator(estimator, "SkyRL", k=k,
                                           k_hint="pass bonkernels.integrations.skyrl.register(k=...), set "
                                           "bk_k in the algorithm config or BONKERNELS_K")
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1).to(torch.float64)
        if "k_weights" in kwargs:
            adv = _advantages(scores, estimator=estimator, **kwargs)
        else:
            adv = _advantages(scores, 1 if k is None else int(k), estimator, **kwargs)
        adv = adv.to(token_level_rewards.dtype)[:, None] * response_mask
    return adv, adv


def make_estimator(estimator: str, *, k: Optional[int] = None, k_weights: Optional[Sequence[float]] = None,
                   scale: Optional[str] = None):
    """The SkyRL-signature function for one estimator (settings resolved at call time)."""
    estimators.get(estimator)
    defaults = {"k": k, "k_weights": None if k_weights is None else [float(w) for w in k_weights], "scale": scale}

    def bonkernels_advantage(token_level_rewards, response_mask, index=None, config=None,
                             grpo_norm_by_std: bool = True, epsilon: float = 1e-6, **kwargs):
        k_ = _setting(config, defaults, "k", "BONKERNELS_K")
        weights = _setting(config, defaults, "k_weights", "BONKERNELS_K_WEIGHTS")
        if isinstance(weights, str):
            weights = [float(w) for w in weights.split(",") if w.strip()]
        scale_ = str(_setting(config, defaults, "scale", "BONKERNELS_SCALE", "mean"))
        return compute_advantage(token_level_rewards, response_mask, index, estimator=estimator,
                                 k=None if k_ is None or weights is not None else int(k_),
                                 k_weights=weights, scale=scale_, epsilon=epsilon,
                                 grpo_norm_by_std=bool(grpo_norm_by_std))

    bonkernels_advantage.__name__ = f"bonkernels_{estimator}_advantage"
    bonkernels_advantage.__qualname__ = bonkernels_advantage.__name__
    bonkernels_advantage.estimator = estimator
    return bonkernels_advantage


def _setting(config, defaults: dict, key: str, env: str, default=None):
    value = None
    if config is not None:
        value = getattr(config, "bk_" + key, None)
        if value is None and hasattr(config, "get"):
            try:
                value = config.get("bk_" + key, None)
            except (TypeError, KeyError):
                value = None
    if value is None:
        value = defaults[key]
    if value is None:
        value = os.environ.get(env)
    return default if value is None else value


def _registry():
    try:
        from skyrl.backends.skyrl_train.utils.ppo_utils import AdvantageEstimatorRegistry
    except ImportError as e:
        raise ImportError(f"SkyRL's advantage-estimator registry cannot be imported ({e}); the SkyRL "
                          "trainer needs Python >= 3.12 (skyrl >= 0.3 with its skyrl-train extra)") from e
    return AdvantageEstimatorRegistry


def register(names: Optional[Sequence[str]] = None, *, k: Optional[int] = None,
             k_weights: Optional[Sequence[float]] = None, scale: Optional[str] = None) -> dict:
    """Register ``bk_<name>`` in SkyRL's registry; returns ``{SkyRL name: function}``.

    ``names``: estimators to register (default: every on-policy estimator). Registering again
    replaces our earlier functions (new settings); a name SkyRL or someone else owns is an error.
    """
    registry = _registry()
    names = list(names) if names else [e for e in estimators.ESTIMATORS if not estimators.get(e).needs_deltas]
    for name in names:
        if estimators.get(name).needs_deltas:
            raise ValueError(f"{name} cannot be a SkyRL advantage estimator (it needs the current policy's "
                             "log-probs); use bonkernels.policy_loss")
    available = set(registry.list_available())
    out = {}
    for name in names:
        skyrl_name = PREFIX + name
        if skyrl_name in available:
            existing = registry._functions.get(skyrl_name)
            if getattr(existing, "estimator", None) != name:
                raise ValueError(f"SkyRL already has an advantage estimator named {skyrl_name!r}")
            registry.unregister(skyrl_name)
        fn = make_estimator(name, k=k, k_weights=k_weights, scale=scale)
        registry.register(skyrl_name, fn)
        out[skyrl_name] = fn
    return out
