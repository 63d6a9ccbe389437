"""The per-token mathematics of the policy loss, shared by every backend (no backend logic here).

Every backend computes ``sum_{i,t} w_i * mask_it * l_it`` (docs in ``bonkernels/loss.py``):
``reference_loss`` is the plain PyTorch specification, ``token_terms`` the same loss with its
analytic gradient (the chunked backend), and ``SavedGradientLoss`` the autograd shape of the fused
backends (forward saves d(loss)/d(logp), backward scales it). The Triton kernel
(``bonkernels/triton/policy_loss.py``) computes ``token_terms`` in one pass.
"""

from __future__ import annotations

from typing import Optional

import torch

# Token log-ratios are clamped to this range before exp (verl clamps to the same range).
LOG_RATIO_LIMIT = 20.0

# Order of the per-token statistic sums every backend returns next to the loss.
STAT_SUMS = ("clipped_tokens", "k1_old_new", "k3_ref")


class LossParams:
    """The scalar settings every backend needs."""

    def __init__(self, ppo: bool, clip_lo: float, clip_hi: float, kl_coef: float, has_ref: bool,
                 all_finite: bool = False):
        self.ppo, self.clip_lo, self.clip_hi = ppo, clip_lo, clip_hi
        self.kl_coef, self.has_ref, self.all_finite = kl_coef, has_ref, all_finite



def reference_loss(logp, old_logp, ref_logp, valid, adv, row_w, p: LossParams):
    """Plain PyTorch, autograd through every op: the specification the fused paths must match."""
    dtype = adv.dtype
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    # Masked-out tokens may hold anything (even NaN): replace them before any arithmetic, so that
    # neither the loss nor the gradient sees them.
    lp = torch.where(valid, logp.to(dtype), zero)
    old = torch.where(valid, old_logp.detach().to(dtype), zero)
    A = adv[:, None]
    log_ratio = (lp - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if p.ppo:
        ratio = torch.exp(log_ratio)
        unclipped = -A * ratio
        clipped = -A * ratio.clamp(1.0 - p.clip_lo, 1.0 + p.clip_hi)
        token_loss = torch.maximum(unclipped, clipped)
        clipped_tokens = (valid & (clipped > unclipped)).sum(dtype=dtype)
    else:
        token_loss = -A * lp
        clipped_tokens = zero
    k3 = zero
    if p.has_ref:
        ref = torch.where(valid, ref_logp.detach().to(dtype), zero)
        d = (ref - lp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        kl = torch.exp(d) - d - 1.0
        if p.kl_coef:
            token_loss = token_loss + p.kl_coef * kl
        k3 = torch.where(valid, kl, zero).sum().detach()
    token_loss = torch.where(valid, token_loss, zero)
    loss = (token_loss * row_w[:, None]).sum()
    k1 = (old - lp).sum().detach()   # masked tokens are 0 in both
    sums = torch.stack([clipped_tokens.detach(), k1, k3])
    return loss.to(logp.dtype), sums


def token_terms(lp, old, ref, valid, A, w, p: LossParams, out: Optional[torch.Tensor] = None):
    """Per-token weighted loss sum, its analytic gradient w.r.t. logp, and the statistic sums.

    ``lp``/``old``/``ref`` are already in the compute dtype with masked tokens set to 0; ``A`` and
    ``w`` are ``[rows, 1]``. Used by the chunked backend (the Triton kernel computes the same in one pass).
    The row weight w >= 0 is folded into the advantage (max(a w, b w) = w max(a, b)), and the
    mask into that product, so masked tokens give 0 loss, 0 gradient and no clipped count.
    ``out`` (optional, compute dtype): where to write the gradient, saving a copy.
    """
    limit = LOG_RATIO_LIMIT
    weight = valid * (-A * w)                       # -A_i w_i on valid tokens, 0 elsewhere
    raw = lp - old                                  # 0 on masked tokens
    if p.ppo:
        ratio = raw.clamp(-limit, limit).exp_()
        unclipped = torch.mul(ratio, weight, out=out) if out is not None else ratio * weight
        clipped = ratio.clamp_(1.0 - p.clip_lo, 1.0 + p.clip_hi).mul_(weight)
        clip_wins = clipped > unclipped
        clipped_tokens = clip_wins.sum().to(lp.dtype)
        loss_sum = torch.maximum(unclipped, clipped).sum()
        # The slope is -A w r where the unclipped branch is the max (ties only happen inside the
        # clip range, where both branches have that slope) and 0 where clipping wins.
        grad = unclipped.masked_fill_(clip_wins, 0.0)
        grad.masked_fill_(raw.abs() > limit, 0.0)      # the clamp of exp's argument (no host sync)
    else:
        loss_sum = (weight * lp).sum()
        grad = out.copy_(weight) if out is not None else weight
        clipped_tokens = lp.new_zeros(())
    k3 = lp.new_zeros(())
    if p.has_ref:
        d_raw = ref - lp
        d = d_raw.clamp(-limit, limit)
        e = torch.exp(d)
        kl = e - d - 1.0                            # exactly 0 on masked tokens (ref = lp = 0 there)
        k3 = kl.sum()
        if p.kl_coef:
            loss_sum = loss_sum + (kl * (p.kl_coef * w)).sum()
            slope = (1.0 - e).mul_(p.kl_coef * w)    # 0 on masked tokens too
            slope.masked_fill_(d_raw.abs() > limit, 0.0)   # the clamp of exp's argument
            grad.add_(slope)
    k1 = -raw.sum()
    return loss_sum, grad, torch.stack([clipped_tokens, k1, k3])


class SavedGradientLoss(torch.autograd.Function):
    """Base of the fused losses: forward(logp, old_logp, ref_logp, valid, adv, row_w, p) computes
    the loss and saves d(loss)/d(logp); backward only scales that saved gradient."""

    @staticmethod
    def backward(ctx, grad_loss, _grad_sums):
        (grad,) = ctx.saved_tensors
        if grad is None:
            return (None,) * 7
        # The stored gradient is for d(loss) = 1 (scaling it needs no host sync, unlike testing for 1).
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None, None
