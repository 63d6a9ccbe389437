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

Backends (modules by role): ``"torch"`` is the plain PyTorch reference (``loss_math.reference_loss``,
autograd through every op); ``"chunked"`` computes loss and analytic gradient together in row
chunks and writes the gradient once (``loss_chunked.py``: plain torch ops, so it runs on any
device; about 2.5x less peak memory); ``"triton"`` is the fused Triton kernel (forward and backward
in one pass over the tokens, ``bonkernels/triton/policy_loss.py``). ``"auto"`` picks Triton for
CUDA tensors when triton is installed, else the chunked path. ``"cpu"``, the chunked path's old
name, still works and warns. For the off-policy estimators the sequence log-ratios are summed (one
more read of ``logp``/``old_logp``) before the advantages, which the token pass needs, exist.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple, Union

import torch

from . import estimators, reference, tables, validation
from .groups import make_layout
from .loss_chunked import chunked_loss
from .loss_math import LossParams, reference_loss
from .backends import kernel_k
from .ops import advantages

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
WEIGHTINGS = ("ppo", "direct")
LOSS_BACKENDS = ("auto", "torch", "chunked", "triton")
# Old backend names still accepted, with a DeprecationWarning: name -> current name.
RENAMED_BACKENDS = {"cpu": "chunked"}


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
        backend: ``"auto"``, ``"torch"`` (reference), ``"chunked"`` (fused, any device) or
            ``"triton"``; ``"cpu"`` is the old name of ``"chunked"``.
        check_inputs: validate values (finite log-probs on valid tokens, 0/1 mask, rewards,
            groups); syncs with the host. With False and ``group_size`` the call (forward and
            backward) makes no host sync, so it can be captured in a CUDA graph; invalid values
            then give NaN (an overflowing sequence delta without ``clamp_delta`` makes its group's
            off-policy advantages NaN) instead of an error.

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
    backend = _check_options(est, k, weighting, loss_agg, backend, kl_coef, ref_logp, clamp_delta)
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

    # Advantages are constants of the rewards (read detached), in the mean scale.
    adv = advantages(rewards.detach().to(torch.float64), k, estimator, k_weights=k_weights, deltas=deltas,
                     scale="mean", eps=eps, check_inputs=check_inputs, max_group_size=group_size,
                     **layout_kwargs)

    compute_dtype = torch.float64 if logp.dtype == torch.float64 else torch.float32
    tokens = valid.sum(-1).to(compute_dtype)
    row_w = _row_weights(tokens, loss_agg)
    params = LossParams(weighting == "ppo", clip_lo, clip_hi, float(kl_coef), ref_logp is not None, all_finite)

    impl = _select_backend(backend, logp)
    loss, sums = impl(logp, old_logp, ref_logp, valid, adv.to(compute_dtype), row_w, params)

    stats = _stats(sums, tokens, adv, rewards, kernel_k(k or 1) if k_weights is None else k_weights,
                   layout_kwargs, group_size)
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

def _check_options(est, k, weighting, loss_agg, backend, kl_coef, ref_logp, clamp_delta) -> str:
    """Checks of the loss's own options; returns the backend's current name. k, k_weights, eps and
    the layouts are checked by ``advantages`` (bonkernels/validation.py), like every other call."""
    if k is not None:
        validation.check_k(k)
    validation.check_choice("weighting", weighting, WEIGHTINGS)
    validation.check_choice("loss_agg", loss_agg, LOSS_AGGREGATIONS)
    if backend in RENAMED_BACKENDS:
        warnings.warn(f"policy_loss(backend={backend!r}) is now called {RENAMED_BACKENDS[backend]!r} (it is "
                      "chunked PyTorch and runs on any device); the old name will be removed",
                      DeprecationWarning, stacklevel=3)
        backend = RENAMED_BACKENDS[backend]
    validation.check_choice("backend", backend, LOSS_BACKENDS)
    if not validation.is_real_number(kl_coef) or not math.isfinite(kl_coef) or kl_coef < 0:
        raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's token log-probs)")
    if est.needs_deltas and weighting == "ppo":
        raise ValueError(f"{est.name} already carries the importance ratios in its weights; "
                         "use weighting='direct' (the ratio objective would count them twice)")
    validation.check_clamp_delta(clamp_delta, est)
    return backend


def _clip_range(clip_eps) -> Tuple[float, float]:
    pair = clip_eps if isinstance(clip_eps, (tuple, list)) else (clip_eps, clip_eps)
    if len(pair) != 2 or not all(validation.is_real_number(c) for c in pair):
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
        if t is not None:
            validation.check_device(name, t)
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
        backend = "triton" if logp.is_cuda and _triton_available() else "chunked"
    if backend == "torch":
        return reference_loss
    if backend == "chunked":
        return chunked_loss
    from .triton import policy_loss as triton_policy_loss
    triton_policy_loss.require(logp)
    return triton_policy_loss.fused_triton_loss


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _group_objective(rewards, k, layout_kwargs, group_size=None) -> torch.Tensor:
    """Mean over non-empty groups of the unbiased max@k (k lowered to n_g for smaller groups);
    with k a sequence of weights over k, the mixed sum_k w_k max@k (spec 12). With a uniform
    ``group_size`` nothing here reads tensor data on the host."""
    values64 = rewards.detach().to(torch.float64)
    layout = make_layout(values64, check=False, **layout_kwargs)
    packed = layout.pack(values64).contiguous()
    if isinstance(k, int):
        per_group = reference.max_at_k_packed(packed, layout.offsets, k, small_groups=2, exact_width=group_size)
    else:
        weights = tables.normalize_k_weights(k)
        sizes = (group_size,) if group_size is not None else tables.bank_sizes(layout.offsets)
        bank, index = tables.build_bank("maxk", weights, sizes, 2, packed.device)
        per_group = reference.max_at_k_packed(packed, layout.offsets, len(weights), 2, bank, index,
                                              exact_width=group_size)
    live = (layout.offsets[1:] - layout.offsets[:-1]) > 0
    return (per_group * live).sum() / live.sum().clamp(min=1)


def _stats(sums, tokens, adv, rewards, k, layout_kwargs, group_size=None) -> dict:
    with torch.no_grad():
        n_tok = tokens.sum()
        denom = n_tok.clamp(min=1.0)
        abs_adv = adv.abs()
        objective = _group_objective(rewards, k, layout_kwargs, group_size)
        return {
            "clip_frac": sums[0] / denom,
            "approx_kl": sums[1] / denom,
            "ref_kl": sums[2] / denom,
            "adv_abs_mean": abs_adv.mean() if abs_adv.numel() else abs_adv.new_zeros(()),
            "adv_abs_max": abs_adv.max() if abs_adv.numel() else abs_adv.new_zeros(()),
            "objective": objective,
            "num_tokens": n_tok,
        }


