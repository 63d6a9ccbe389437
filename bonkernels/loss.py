"""Fused, autograd-aware policy loss with group-coupled (pass@k / max@k) advantages.

``policy_loss`` turns token log-probabilities and per-sequence rewards into one scalar loss:

1. per-sequence log-ratios ``sum_t mask * (logp - old_logp)`` (detached), deltas = exp(.) - 1
   (clamped to ``[-clamp_delta, clamp_delta]``), only for the off-policy estimators;
2. advantages from ``bonkernels.advantages`` in the ``mean`` scale (so ``estimator="grpo"`` is
   exactly the usual GRPO loss), computed without gradient;
3. the per-token surrogate, aggregated over tokens and sequences.

Every backend computes the same loss ``sum_{i,t} w_i * mask_it * l_it`` where ``w_i`` is the
aggregation weight of row i (see ``_row_weights``) and ``l_it`` is

* ``weighting="ppo"``:    ``max(-A_i r_it, -A_i clip(r_it, 1 - lo, 1 + hi))``, ``r = exp(logp - old_logp)``;
* ``weighting="direct"``: ``-A_i * logp_it`` (the estimator's own gradient; the off-policy weights
  already carry the importance ratios, so they are not multiplied by the ratio again);

plus ``kl_coef * (exp(ref - logp) - (ref - logp) - 1)`` (the k3 estimator) when ``kl_coef > 0``.
Token log-ratios are clamped to [-20, 20] before ``exp``, as verl does, so one wild token cannot
overflow the loss or turn a zero gradient into NaN.

Backends: ``"torch"`` is the plain PyTorch reference (autograd through every op); ``"cpu"`` is a
fused autograd Function that computes loss and analytic gradient together in row chunks and
writes the gradient once (about 2.5x less peak memory than plain PyTorch; plain torch ops, so it
runs on any device); ``"triton"`` is the fused Triton kernel (forward and backward in one pass
over the tokens, see ``bonkernels/triton/policy_loss.py``). ``"auto"`` picks Triton for CUDA
tensors when triton is installed and the fused CPU path otherwise. For the off-policy estimators
the sequence log-ratios are summed (one more read of ``logp``/``old_logp``) before the advantages,
which the token pass needs, exist.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from . import estimators, reference
from .groups import make_layout

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
WEIGHTINGS = ("ppo", "direct")
LOSS_BACKENDS = ("auto", "torch", "cpu", "triton")

# Token log-ratios are clamped to this range before exp (verl clamps to the same range).
LOG_RATIO_LIMIT = 20.0

# Row chunk of the fused CPU path: about this many tokens per chunk bounds its temporaries.
_CPU_CHUNK_TOKENS = 1 << 16

# Order of the per-token statistic sums every backend returns next to the loss.
_STAT_SUMS = ("clipped_tokens", "k1_old_new", "k3_ref")


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, rewards: torch.Tensor, k: Optional[int],
                estimator: str = "maxk_loo1", *, k_weights=None, mask: Optional[torch.Tensor] = None,
                offsets: Optional[torch.Tensor] = None, group_size: Optional[int] = None,
                group_ids: Optional[torch.Tensor] = None, ref_logp: Optional[torch.Tensor] = None,
                kl_coef: float = 0.0, clip_eps: Union[float, Tuple[float, float]] = 0.2,
                clamp_delta: Optional[float] = None, weighting: str = "ppo",
                loss_agg: str = "token_mean", eps: float = 1e-6, backend: str = "auto",
                check_inputs: bool = True):
    """Policy-gradient loss with pass@k / max@k-aware group advantages, and its statistics.

    Args:
        logp: ``[B, T]`` log-probabilities of the sampled tokens under the current policy (the
            tensor the gradient flows to).
        old_logp: ``[B, T]`` log-probabilities under the sampling policy (treated as constant).
        rewards: ``[B]`` one scalar reward per sequence (treated as constant).
        k: the pass@k / max@k target (a Python int >= 1; see ``bonkernels.advantages``); None with
            ``k_weights`` or for an estimator that ignores k.
        k_weights: a mixture over k instead of k (weights for k = 1..T; docs/spec.md section 12).
        estimator: any of ``bonkernels.ESTIMATORS``. The off-policy estimators
            (``maxk_offpolicy``, ``maxk_offpolicy_exact``) get their deltas from the sequence
            log-ratios and need ``weighting="direct"``.
        mask: ``[B, T]`` 0/1 response mask (bool, integer or float); None means every token counts.
        offsets / group_size / group_ids: how the B sequences form groups (exactly one): CSR
            offsets ``[G+1]``, a uniform group size dividing B, or one integer id per sequence.
        ref_logp: ``[B, T]`` reference-policy log-probabilities for the KL penalty (constant).
        kl_coef: weight of the k3 KL penalty to ``ref_logp`` (needs ``ref_logp`` when > 0).
        clip_eps: PPO clip range, a float or a ``(low, high)`` pair (``weighting="ppo"`` only).
        clamp_delta: clamp the off-policy deltas to ``[-c, c]`` (off-policy estimators only). The
            deltas are sequence-level ratios minus 1, which grow fast with the sequence length.
        weighting: ``"ppo"`` (clipped ratio objective) or ``"direct"`` (``-stopgrad(A) * logp``;
            with ``loss_agg="seq_mean_token_sum"`` and equal group sizes its gradient is exactly the
            estimator's sum_i A_i grad log p(y_i), averaged over groups; ``clip_eps`` is unused).
        loss_agg: ``"token_mean"`` (sum over valid tokens / their number),
            ``"seq_mean_token_sum"`` (per-sequence token sums, averaged over sequences that have
            tokens) or ``"seq_mean_token_mean"`` (per-sequence token means, averaged likewise);
            verl's definitions. A sequence with no tokens adds nothing and is not counted.
        eps: added to the std by the z-scored estimators (1e-6 as verl; TRL uses 1e-4).
        backend: ``"auto"``, ``"torch"`` (reference), ``"cpu"`` (fused) or ``"triton"``.
        check_inputs: validate values (finite log-probs on valid tokens, 0/1 mask, rewards,
            groups); syncs with the host.

    Returns:
        ``(loss, stats)``: a scalar loss in the dtype of ``logp`` and a dict of detached scalar
        tensors: ``clip_frac`` (share of valid tokens where the clipped branch is active),
        ``approx_kl`` (mean ``old_logp - logp`` over valid tokens, verl's ``ppo_kl``),
        ``ref_kl`` (mean k3 KL to ``ref_logp``; 0 without it), ``adv_abs_mean`` /
        ``adv_abs_max`` (over sequences), ``objective`` (mean over non-empty groups of the unbiased
        max@k of the rewards, k lowered to the group size where a group is smaller; pass@k for
        0/1 rewards), ``num_tokens``.
    """
    est = estimators.get(estimator)
    # k may be None with k_weights (a mixture over k) or for an estimator that ignores k;
    # advantages() checks k and k_weights together
    _check_options(est, 1 if k is None else k, weighting, loss_agg, backend, kl_coef, ref_logp, clamp_delta)
    clip_lo, clip_hi = _clip_range(clip_eps)
    B, T = _check_shapes(logp, old_logp, rewards, mask, ref_logp)
    layout_kwargs = _group_layout(B, offsets, group_size, group_ids, rewards.device)

    valid = _valid_mask(mask, logp)
    # all_finite: every log-prob (masked-out ones included) is finite, so the fused path may mask
    # by multiplying instead of the slower where (which it needs when NaN may hide under the mask)
    all_finite = _check_values(logp, old_logp, ref_logp, mask, valid) if check_inputs else False

    deltas = None
    if est.needs_deltas:
        deltas = sequence_deltas(logp, old_logp, valid, clamp_delta)
        if check_inputs and not bool(torch.isfinite(deltas).all()):
            i = int((~torch.isfinite(deltas)).nonzero()[0])
            raise ValueError(f"sequence {i}: exp(sum of token log-ratios) - 1 overflows; "
                             "pass clamp_delta to bound the off-policy deltas")

    from .ops import advantages   # late import: the package's __init__ imports this module
    adv = advantages(rewards.detach().to(torch.float64), k, estimator, k_weights=k_weights, deltas=deltas,
                     scale="mean",
                     eps=eps, check_inputs=check_inputs, **layout_kwargs)

    compute_dtype = torch.float64 if logp.dtype == torch.float64 else torch.float32
    tokens = valid.sum(-1).to(compute_dtype)
    row_w = _row_weights(tokens, loss_agg)
    params = _LossParams(weighting == "ppo", clip_lo, clip_hi, float(kl_coef), ref_logp is not None, all_finite)

    impl = _select_backend(backend, logp)
    loss, sums = impl(logp, old_logp, ref_logp, valid, adv.to(compute_dtype), row_w, params)

    stats = _stats(sums, tokens, adv, rewards, (k or 1) if k_weights is None else k_weights, layout_kwargs)
    return loss, stats


def sequence_deltas(logp: torch.Tensor, old_logp: torch.Tensor, valid: torch.Tensor,
                    clamp_delta: Optional[float]) -> torch.Tensor:
    """pi_theta/pi_old - 1 per sequence, from detached token log-probs, in float64 [B]."""
    token_lr = torch.where(valid, logp.detach().to(torch.float64) - old_logp.detach().to(torch.float64), 0.0)
    deltas = torch.expm1(token_lr.sum(-1))
    if clamp_delta is not None:
        deltas = deltas.clamp(-float(clamp_delta), float(clamp_delta))
    return deltas


# ----------------------------------------------------------------------------- argument checks

class _LossParams:
    """The scalar settings every backend needs."""

    def __init__(self, ppo: bool, clip_lo: float, clip_hi: float, kl_coef: float, has_ref: bool,
                 all_finite: bool = False):
        self.ppo, self.clip_lo, self.clip_hi = ppo, clip_lo, clip_hi
        self.kl_coef, self.has_ref, self.all_finite = kl_coef, has_ref, all_finite


def _check_options(est, k, weighting, loss_agg, backend, kl_coef, ref_logp, clamp_delta) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be a Python int, got {type(k).__name__}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGREGATIONS}, got {loss_agg!r}")
    if backend not in LOSS_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(LOSS_BACKENDS)}")
    if not isinstance(kl_coef, (int, float)) or not math.isfinite(kl_coef) or kl_coef < 0:
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's token log-probs)")
    if est.needs_deltas and weighting == "ppo":
        raise ValueError(f"{est.name} already carries the importance ratios in its weights; "
                         "use weighting='direct' (the ratio objective would count them twice)")
    if clamp_delta is not None:
        if not est.needs_deltas:
            raise ValueError(f"clamp_delta only applies to the off-policy estimators; {est.name!r} "
                             "uses no deltas")
        if isinstance(clamp_delta, bool) or not isinstance(clamp_delta, (int, float)) or not clamp_delta > 0:
            raise ValueError(f"clamp_delta must be a positive number or None, got {clamp_delta!r}")


def _clip_range(clip_eps) -> Tuple[float, float]:
    pair = clip_eps if isinstance(clip_eps, (tuple, list)) else (clip_eps, clip_eps)
    if len(pair) != 2 or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in pair):
        raise ValueError(f"clip_eps must be a number or a (low, high) pair, got {clip_eps!r}")
    lo, hi = float(pair[0]), float(pair[1])
    if not (0 <= lo <= 1 and 0 <= hi and math.isfinite(hi)):
        raise ValueError(f"clip_eps must satisfy 0 <= low <= 1 and 0 <= high < inf, got {clip_eps!r}")
    return lo, hi


def _check_shapes(logp, old_logp, rewards, mask, ref_logp) -> Tuple[int, int]:
    for name, t in (("logp", logp), ("old_logp", old_logp), ("rewards", rewards), ("ref_logp", ref_logp),
                    ("mask", mask)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if logp.dim() != 2:
        raise ValueError(f"logp must be 2-D [B, T], got shape {tuple(logp.shape)}")
    B, T = logp.shape
    for name, t in (("logp", logp), ("old_logp", old_logp), ("ref_logp", ref_logp)):
        if t is not None and not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    for name, t in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}, got {tuple(t.shape)}")
    if rewards.shape != (B,):
        raise ValueError(f"rewards must be 1-D [B] with B = {B} (one per sequence), got shape "
                         f"{tuple(rewards.shape)}")
    for name, t in (("old_logp", old_logp), ("rewards", rewards), ("ref_logp", ref_logp), ("mask", mask)):
        if t is not None and t.device != logp.device:
            raise ValueError(f"{name} is on {t.device} but logp is on {logp.device}")
    return B, T


def _group_layout(B: int, offsets, group_size, group_ids, device) -> dict:
    given = [n for n, v in (("offsets", offsets), ("group_size", group_size), ("group_ids", group_ids))
             if v is not None]
    if len(given) != 1:
        raise ValueError("say how the sequences form groups with exactly one of offsets, group_size, "
                         f"group_ids (got {', '.join(given) if given else 'none'})")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if B % group_size:
            raise ValueError(f"group_size={group_size} does not divide the batch size B = {B}")
        offsets = torch.arange(0, B + 1, group_size, dtype=torch.int64, device=device)
        return {"offsets": offsets}
    if offsets is not None:
        return {"offsets": offsets}
    return {"group_ids": group_ids}


def _valid_mask(mask, logp) -> torch.Tensor:
    if mask is None:
        return torch.ones(logp.shape, dtype=torch.bool, device=logp.device)
    return mask if mask.dtype == torch.bool else mask != 0


def _check_values(logp, old_logp, ref_logp, mask, valid) -> bool:
    """Raise on non-finite log-probs inside the mask; return True when every value is finite."""
    if mask is not None and mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must hold only 0 and 1")
    named = [(n, t) for n, t in (("logp", logp), ("old_logp", old_logp), ("ref_logp", ref_logp)) if t is not None]
    # Fast path, one reduction per tensor and one sync: a finite float64 sum means every value is
    # finite. Otherwise look for non-finite values inside the mask (outside it they are allowed).
    total = sum(t.detach().sum(dtype=torch.float64) for _, t in named)
    if bool(torch.isfinite(total)):
        return True
    for name, t in named:
        bad = valid & ~torch.isfinite(t.detach())
        if bool(bad.any()):
            i, j = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"{name}[{i}, {j}] = {float(t[i, j])} is not finite (a token inside the mask); "
                             "log-probs of masked-out tokens may be anything")
    return False


def _row_weights(tokens: torch.Tensor, loss_agg: str) -> torch.Tensor:
    """w_i so that loss = sum_i w_i sum_t mask_it l_it for each aggregation (verl's definitions)."""
    if loss_agg == "token_mean":
        return (1.0 / tokens.sum().clamp(min=1.0)).expand_as(tokens).contiguous()
    live = (tokens > 0).to(tokens.dtype)
    per_seq = live / live.sum().clamp(min=1.0)
    if loss_agg == "seq_mean_token_sum":
        return per_seq
    return per_seq / tokens.clamp(min=1.0)


def _select_backend(backend: str, logp: torch.Tensor):
    if backend == "auto":
        backend = "triton" if logp.is_cuda and _triton_available() else "cpu"
    if backend == "torch":
        return reference_loss
    if backend == "cpu":
        return fused_cpu_loss
    from .triton import policy_loss as triton_policy_loss
    triton_policy_loss.require(logp)
    return triton_policy_loss.fused_triton_loss


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _group_objective(rewards, k, layout_kwargs) -> torch.Tensor:
    """Mean over non-empty groups of the unbiased max@k (k lowered to n_g for smaller groups);
    with k a sequence of weights over k, the mixed sum_k w_k max@k (spec 12)."""
    values64 = rewards.detach().to(torch.float64)
    layout = make_layout(values64, check=False, **layout_kwargs)
    packed = layout.pack(values64).contiguous()
    if isinstance(k, int):
        per_group = reference.max_at_k_packed(packed, layout.offsets, k, small_groups=2)
    else:
        from . import tables
        weights = tables.normalize_k_weights(k)
        bank, index = tables.build_bank("maxk", weights, tables.bank_sizes(layout.offsets), 2, packed.device)
        per_group = reference.max_at_k_packed(packed, layout.offsets, len(weights), 2, bank, index)
    live = (layout.offsets[1:] - layout.offsets[:-1]) > 0
    return (per_group * live).sum() / live.sum().clamp(min=1)


def _stats(sums, tokens, adv, rewards, k, layout_kwargs) -> dict:
    with torch.no_grad():
        n_tok = tokens.sum()
        denom = n_tok.clamp(min=1.0)
        abs_adv = adv.abs()
        objective = _group_objective(rewards, k, layout_kwargs)
        return {
            "clip_frac": sums[0] / denom,
            "approx_kl": sums[1] / denom,
            "ref_kl": sums[2] / denom,
            "adv_abs_mean": abs_adv.mean() if abs_adv.numel() else abs_adv.new_zeros(()),
            "adv_abs_max": abs_adv.max() if abs_adv.numel() else abs_adv.new_zeros(()),
            "objective": objective,
            "num_tokens": n_tok,
        }


# ----------------------------------------------------------------------------- reference backend

def reference_loss(logp, old_logp, ref_logp, valid, adv, row_w, p: _LossParams):
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


# ----------------------------------------------------------------------------- fused CPU backend

def token_terms(lp, old, ref, valid, A, w, p: _LossParams, out: Optional[torch.Tensor] = None):
    """Per-token weighted loss sum, its analytic gradient w.r.t. logp, and the statistic sums.

    ``lp``/``old``/``ref`` are already in the compute dtype with masked tokens set to 0; ``A`` and
    ``w`` are ``[rows, 1]``. Used by the fused CPU path (the Triton kernel has its own copy).
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
        if raw.numel() and float(raw.abs().max()) > limit:   # the clamp of exp's argument
            grad.masked_fill_(raw.abs() > limit, 0.0)
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
            if float(d_raw.abs().max()) > limit:     # the clamp of exp's argument
                slope.masked_fill_(d_raw.abs() > limit, 0.0)
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


class _FusedCPUPolicyLoss(SavedGradientLoss):
    """Loss and gradient in one chunked pass."""

    @staticmethod
    def forward(ctx, logp, old_logp, ref_logp, valid, adv, row_w, p):
        dtype = adv.dtype
        B, T = logp.shape
        need_grad = ctx.needs_input_grad[0]
        grad = torch.empty(logp.shape, dtype=logp.dtype, device=logp.device) if need_grad else None
        total = torch.zeros((), dtype=dtype, device=logp.device)
        sums = torch.zeros(len(_STAT_SUMS), dtype=dtype, device=logp.device)
        rows = max(1, _CPU_CHUNK_TOKENS // max(T, 1))
        for r0 in range(0, B, rows):
            r1 = min(B, r0 + rows)
            v = valid[r0:r1]
            if p.all_finite:   # multiplying by the 0/1 mask is exact and much faster than where
                vf = v.to(dtype)
                lp = logp[r0:r1].to(dtype) * vf
                old = old_logp[r0:r1].to(dtype) * vf
                ref = ref_logp[r0:r1].to(dtype) * vf if p.has_ref else None
            else:              # masked-out tokens may hold NaN: never let them into arithmetic
                lp = torch.where(v, logp[r0:r1].to(dtype), 0.0)
                old = torch.where(v, old_logp[r0:r1].to(dtype), 0.0)
                ref = torch.where(v, ref_logp[r0:r1].to(dtype), 0.0) if p.has_ref else None
            out = grad[r0:r1] if need_grad and grad.dtype == dtype else None
            loss_sum, g, s = token_terms(lp, old, ref, v, adv[r0:r1, None], row_w[r0:r1, None], p, out=out)
            total += loss_sum
            sums += s
            if need_grad and out is None:
                grad[r0:r1] = g
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(sums)
        return total.to(logp.dtype), sums



def fused_cpu_loss(logp, old_logp, ref_logp, valid, adv, row_w, p: _LossParams):
    """The fused path in chunked PyTorch; works on any device (the default on CPU)."""
    return _FusedCPUPolicyLoss.apply(logp, old_logp.detach(), None if ref_logp is None else ref_logp.detach(),
                                     valid, adv, row_w, p)
