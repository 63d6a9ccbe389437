"""The differentiable importance-weighted max@k objective (spec 3.4).

For a group of n samples drawn from pi_old with rewards g and sequence log-ratios
``logratio_i = log pi_theta(y_i) - log pi_old(y_i)`` (rho_i = exp(logratio_i)),

    J(rho) = (1 / C(n, k)) * sum_{|I| = k} (prod_{l in I} rho_l) * max_{i in I} g_i

is an unbiased estimate of max@k under pi_theta. Its gradient with respect to ``logratio_i`` is
the exact off-policy weight A^exact_i of spec 3.4 (sum scale), so the autograd op below returns J
in the forward pass and those weights in the backward pass.

``exact=False`` is the first-order version (spec 3.2): the forward is
``J1 = max@k_hat + sum_i delta_i s_i`` (J to first order in delta = rho - 1, with s the on-policy
weights) and the backward is Bagirov's first-order weights A'_i. Both agree with the exact ones up
to O(delta^2) and cost O(n log n) per group instead of O(n^2 k).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import estimators, reference, validation
from .groups import make_layout


def maxk_objective(rewards: torch.Tensor, logratio: torch.Tensor, k: int, *,
                   offsets: Optional[torch.Tensor] = None, lengths: Optional[torch.Tensor] = None,
                   group_ids: Optional[torch.Tensor] = None, exact: bool = True) -> torch.Tensor:
    """Importance-weighted max@k per group, differentiable in ``logratio``.

    Args:
        rewards: float rewards in any layout ``bonkernels.advantages`` accepts (``[G, n]``, padded
            with ``lengths``, packed ``[N]`` with ``offsets``, or ``[N]`` with ``group_ids``);
            treated as constant.
        logratio: sequence log-ratios ``log pi_theta - log pi_old``, same shape as ``rewards``
            (padded positions are ignored).
        k: 1 <= k <= n_g for every group.
        exact: True for J and its exact gradient (spec 3.4, O(n^2 k) per group); False for the
            first-order value and weights (spec 3.2).

    Returns:
        ``[G]`` in the dtype of ``logratio``; groups in layout order (ascending id for group_ids).
        The backward pass gives d J_g / d logratio_i = A_i (exact or first-order weights).
    """
    validation.check_tensor("rewards", rewards)
    validation.check_tensor("logratio", logratio)
    if logratio.shape != rewards.shape:
        raise ValueError(f"logratio must have the shape of rewards {tuple(rewards.shape)}, got "
                         f"{tuple(logratio.shape)}")
    validation.check_same_device("logratio", logratio, "rewards", rewards)
    k = validation.check_k(k)
    layout = make_layout(rewards, offsets=offsets, lengths=lengths, group_ids=group_ids, check=True)
    values = layout.pack(rewards.detach()).to(torch.float64).contiguous()
    validation.check_finite("rewards", values, layout)
    validation.check_group_sizes(layout, k, estimators.get("maxk"), allow_empty=False)
    packed_lr = layout.pack(logratio)
    validation.check_finite("logratio", packed_lr.detach(), layout)
    J = _MaxkObjective.apply(packed_lr, values, layout.offsets, k, bool(exact))
    return J


def _objective_and_weights(values, offsets, logratio, k, exact):
    """(J [G], dJ/dlogratio [N]) in float64, packed order."""
    lr = logratio.detach().to(torch.float64)
    if exact:
        rho = torch.exp(lr)
        J = reference.importance_weighted_maxk(values, offsets, rho, k)
        weights = reference.offpolicy_exact_weights(values, offsets, rho, k)
        return J, weights
    from .ops import advantages
    deltas = torch.expm1(lr)
    s = advantages(values, k, "maxk", offsets=offsets, scale="sum", check_inputs=False, backend="torch")
    weights = advantages(values, k, "maxk_offpolicy", offsets=offsets, deltas=deltas, scale="sum",
                         check_inputs=False, backend="torch")
    # J1 = max@k_hat + sum_i delta_i s_i, and max@k_hat = sum_i s_i / k (spec 2.2)
    group = torch.repeat_interleave(torch.arange(offsets.numel() - 1, device=values.device),
                                    offsets[1:] - offsets[:-1])
    per_sample = s * (1.0 / k + deltas)
    J = torch.zeros(offsets.numel() - 1, dtype=torch.float64, device=values.device)
    J.index_add_(0, group, per_sample)
    return J, weights


class _MaxkObjective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logratio, values, offsets, k, exact):
        J, weights = _objective_and_weights(values, offsets, logratio, k, exact)
        group = torch.repeat_interleave(torch.arange(offsets.numel() - 1, device=values.device),
                                        offsets[1:] - offsets[:-1])
        ctx.save_for_backward(weights, group)
        return J.to(logratio.dtype)

    @staticmethod
    def backward(ctx, grad_J):
        weights, group = ctx.saved_tensors
        grad = grad_J.to(torch.float64)[group] * weights
        return grad.to(grad_J.dtype), None, None, None, None
