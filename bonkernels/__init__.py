"""bonkernels: pass@k / max@k-aware advantages for RL on LLMs, as one fused batched op.

Public API (nothing else is public):

    advantages(rewards, k=None, estimator="maxk_loo1", *, k_weights=None, offsets=None, lengths=None,
               group_ids=None, deltas=None, clamp_delta=None, clip=None, scale="mean", backend="auto",
               small_groups="error", eps=1e-6, check_inputs=True, max_group_size=None)
    prepare_advantages(k=None, estimator="maxk_loo1", *, group_size, k_weights=None, clamp_delta=None,
                       clip=None, scale="mean", backend="auto", small_groups="error", eps=1e-6,
                       dtype=torch.float32, device="cpu") -> AdvantagesPlan
                                              plan(rewards [G, group_size], deltas=None): advantages
                                              for a hot loop, everything but the values checked once
    pass_at_k(correct, k=None, *, k_weights=None, offsets=None, lengths=None, group_ids=None)
    max_at_k(rewards, k=None, *, k_weights=None, offsets=None, lengths=None, group_ids=None)
    maxrl_weights(T)                          -> (1, 1/2, ..., 1/T): MaxRL's order-T truncation
    anneal_k_weights(k_start, k_end, progress) -> PKPO's k annealing as weights over k
    policy_loss(logp, old_logp, rewards, k, estimator="maxk_loo1", *, k_weights=None, mask=None,
                offsets=None, group_size=None, group_ids=None, ref_logp=None, kl_coef=0.0,
                clip_eps=0.2, clamp_delta=None, weighting="ppo", loss_agg="token_mean", eps=1e-6,
                backend="auto", check_inputs=True) -> (loss, stats)
    maxk_objective(rewards, logratio, k, *, offsets=None, lengths=None, group_ids=None, exact=True)
    ESTIMATORS

See docs/conventions.md for what each estimator computes and docs/spec.md for the mathematics.
"""

from .estimators import BON_RLB_DEFAULT_CLIP, ESTIMATORS
from .loss import policy_loss
from .objective import maxk_objective
from .plan import AdvantagesPlan, prepare_advantages
from .ops import BACKENDS, advantages, max_at_k, pass_at_k
from .tables import anneal_k_weights, maxrl_weights

__version__ = "0.1.0"

__all__ = ["advantages", "prepare_advantages", "AdvantagesPlan", "pass_at_k", "max_at_k", "policy_loss", "maxk_objective", "ESTIMATORS", "BACKENDS", "BON_RLB_DEFAULT_CLIP",
           "maxrl_weights", "anneal_k_weights"]
