"""The public ops: ``advantages``, ``pass_at_k``, ``max_at_k``.

Each call checks its arguments (validation.py), converts the user's layout to the packed form
(groups.py), picks a backend from the table (backends.py) and runs it once. Every backend implements
the packed interface ``advantages_packed(values, offsets, deltas, **KernelCall fields)``
(docs/conventions.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict
from typing import Optional, Tuple

import torch

from . import backends, estimators, reference, tables, validation
from .groups import make_layout

BACKENDS = backends.NAMES
FLOAT_DTYPES = validation.FLOAT_DTYPES
# Any k beyond every group's size behaves alike (the small-groups rule decides): kernels get at most
# this, so a Python int of any size fits their 32-bit arguments.
KERNEL_K_MAX = 2 ** 30


@dataclass(frozen=True)
class KernelCall:
    """The scalar arguments of one backend call, after validation (the packed interface)."""

    k: int
    estimator_code: int
    clamp_delta: Optional[float]
    clip_lo: float
    clip_hi: float
    mean_scale: bool
    small_groups: int
    eps: float
    max_group_size: Optional[int]

    def run(self, impl, values, offsets, deltas, **bank):
        return impl(values, offsets, deltas, **asdict(self), **bank)


def advantages(rewards: torch.Tensor, k: Optional[int] = None, estimator: str = "maxk_loo1", *, k_weights=None,
               offsets=None, lengths=None,
               group_ids=None, deltas: Optional[torch.Tensor] = None, clamp_delta: Optional[float] = None,
               clip: Optional[Tuple[float, float]] = None, scale: str = "mean", backend: str = "auto",
               small_groups: str = "error", eps: float = 1e-6, check_inputs: bool = True,
               max_group_size: Optional[int] = None) -> torch.Tensor:
    """Per-sample advantages of every group, from one batched op.

    Args:
        rewards: float16/bfloat16/float32/float64 rewards on the CPU or a CUDA device: ``[G, n]``
            (full rows, or a valid prefix per row with ``lengths``) or ``[N]`` with ``offsets`` or
            ``group_ids``. Advantages are constants of the rewards: a tensor that requires grad is
            read detached, and no gradient flows back into it (on every backend).
        k: the target of pass@k / max@k (a Python int >= 1, of any size: a k above every group's
            size follows ``small_groups``). Estimators whose registry entry has ``uses_k=False``
            (``tang_loo``, ``grpo``, ``rloo``, ``dr_grpo``, ``bon_max_*``, ``maxrl``) ignore it and
            may leave it None. Must be None when ``k_weights`` is given.
        estimator: one of :data:`bonkernels.ESTIMATORS` (docs/spec.md has each formula).
        k_weights: a mixture over k (spec 12): a 1-D sequence or tensor ``w`` of finite weights
            >= 0 for k = 1..T, not all zero; the advantages are those of the objective
            ``sum_k w_k max@k``. For the estimators linear in their weight tables (registry field
            ``linear_in_tables``). The k rules and ``small_groups`` apply to the largest k with a
            non-zero weight ("clamp" moves the weight of too-large k to the largest valid k).
        offsets: int64 ``[G+1]`` CSR offsets into packed ``[N]`` rewards.
        lengths: int ``[G]``, the valid prefix of each row of padded ``[G, n]`` rewards.
        group_ids: integer ``[N]``; samples of a group need not be adjacent.
        deltas: pi_theta/pi_old - 1 per sequence, same shape as rewards; only for the off-policy
            estimators (registry field ``needs_deltas``), which require it.
        clamp_delta: clamp deltas to ``[-c, c]`` before use (a positive real number).
        clip: ``(lo, hi)`` real numbers: clip the output advantages. An estimator with a
            ``default_clip`` in the registry (``bon_rlb``) uses it when this is None.
        scale: ``"sum"`` (gradient = sum_i A_i grad log p_i) or ``"mean"`` (``n_g`` times that,
            for losses that average over samples).
        backend: ``"auto"``, ``"torch"`` (the reference), ``"cpu"``, ``"cuda"`` or ``"triton"``
            (bonkernels/backends.py has the table ``auto`` looks up).
        small_groups: what to do with a group smaller than k needs: ``"error"`` (default),
            ``"zero"`` (its advantages are 0) or ``"clamp"`` (k is lowered to what the group allows).
        eps: added to the standard deviation by the z-scored estimators (grpo, bon_mean, chen_passk).
        check_inputs: validate values (finite, binary where needed, group sizes). This syncs with
            the host; with False and a ``max_group_size`` (free for ``[G, n]`` rewards) the call
            makes no host sync for the full and ``offsets`` layouts (``lengths`` and ``group_ids``
            need one for their data-dependent sizes, as does a mixture over k with packed groups
            larger than 64), and invalid groups give undefined values (NaN for non-finite ones).
        max_group_size: optional host-side bound on the group size, so kernels need not compute it.

    Returns:
        advantages with the shape and dtype of ``rewards``; padded tail positions are 0.
    """
    est = estimators.get(estimator)
    validation.check_tensor("rewards", rewards)
    rewards = rewards.detach()
    weights = _resolve_k(k, k_weights, est)
    if weights is not None:
        k = tables.largest_k(weights)
    elif k is None or not est.uses_k:
        k = 1                                  # ignored by this estimator
    validation.check_choice("backend", backend, BACKENDS)
    mean_scale = validation.check_scale(scale)
    small_code = validation.small_groups_code(small_groups)
    eps = validation.check_eps(eps)
    clamp_delta = validation.check_clamp_delta(clamp_delta, est)
    clip_lo, clip_hi = validation.resolve_clip(clip, est)
    max_group_size = validation.check_max_group_size(max_group_size)
    validation.check_deltas_argument(deltas, rewards, est)

    layout = make_layout(rewards, offsets=offsets, lengths=lengths, group_ids=group_ids, check=check_inputs)
    values = layout.pack(rewards).contiguous()
    packed_deltas = None if deltas is None else layout.pack(deltas.detach()).to(rewards.dtype).contiguous()
    if max_group_size is None and layout.kind in ("full", "padded"):
        max_group_size = rewards.shape[1]          # a free bound: kernels need not look for it

    if check_inputs:
        validation.check_values(values, layout, est, k, small_code, packed_deltas, max_group_size)
        if max_group_size is None and values.is_cuda:
            sizes = layout.offsets[1:] - layout.offsets[:-1]
            max_group_size = int(sizes.max()) if sizes.numel() else 0   # already synced: give kernels the bound
    call = KernelCall(min(k, KERNEL_K_MAX), est.code, clamp_delta, clip_lo, clip_hi, mean_scale, small_code,
                      eps, max_group_size)
    impl = backends.select(backend, values, est, max_group_size)
    if weights is None:
        out = call.run(impl, values, layout.offsets, packed_deltas)
    elif est.name in tables.SUM_OVER_K_ESTIMATORS:
        out = _sum_over_k(values, layout, packed_deltas, weights, est, call)
    else:
        sizes = tables.bank_sizes(layout.offsets, max_group_size,
                                  rewards.shape[1] if layout.kind == "full" else None)
        bank, bank_index = tables.build_bank(est.name, weights, sizes, small_code, values.device)
        out = call.run(impl, values, layout.offsets, packed_deltas, bank=bank, bank_index=bank_index)
    return layout.unpack(out)


def _resolve_k(k, k_weights, est: estimators.Estimator):
    """The normalized mixture weights (None for a single k), after checking k against them."""
    if k_weights is None:
        if k is None:
            if est.uses_k:
                raise TypeError(f"estimator {est.name!r} needs k (an int >= 1) or k_weights")
            return None
        validation.check_k(k)
        return None
    if k is not None:
        raise ValueError("give either k or k_weights, not both (k_weights already says which k count)")
    if est.name not in tables.MIXABLE_ESTIMATORS:
        kind = "ignores k" if not est.uses_k else "is not linear in its weight tables"
        raise ValueError(f"k_weights (a mixture over k) does not apply to {est.name!r}, which {kind}; "
                         f"mixtures run for {', '.join(tables.MIXABLE_ESTIMATORS)}")
    return tables.normalize_k_weights(k_weights)


def _sum_over_k(values, layout, deltas, weights, est, call: KernelCall):
    """A mixture for an estimator without a table bank: sum_k w_k A^(k) of reference calls."""
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    total = torch.zeros(values.shape, dtype=torch.float64, device=values.device)
    for k, w in enumerate(weights, start=1):
        if w == 0:
            continue
        part = reference.advantages_packed(values.to(torch.float64), layout.offsets,
                                           None if deltas is None else deltas.to(torch.float64), k,
                                           est.code, call.clamp_delta, -math.inf, math.inf, call.mean_scale, 2,
                                           call.eps, call.max_group_size)
        total += w * part
    if call.small_groups != 2:                 # zero (and unchecked error): the largest k decides
        too_small = sizes - est.k_margin < tables.largest_k(weights)
        sample_group = torch.repeat_interleave(too_small, sizes)
        total = torch.where(sample_group, torch.zeros_like(total), total)
    return total.clamp(call.clip_lo, call.clip_hi).to(values.dtype)


def pass_at_k(correct: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
              group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased pass@k per group (Chen et al. 2021): 1 - C(n-c, k)/C(n, k).

    ``correct`` holds 0/1 values (bool, integer or float). Returns ``[G]`` in the input's float
    dtype (float64 for bool/integer input). Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k pass@k (spec 12).
    """
    validation.check_tensor("correct", correct, allow_integer=True)
    weights = _resolve_k(k, k_weights, estimators.get("maxk"))
    k = tables.largest_k(weights) if weights is not None else k
    values, layout = _metric_values(correct.detach(), k, offsets, lengths, group_ids, small_groups)
    validation.check_binary(values, layout, "pass_at_k")
    return _metric(values, layout, k, small_groups, correct.dtype, weights)


def max_at_k(rewards: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
             group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased max@k per group: the mean over all k-subsets of the subset's best reward.

    Returns ``[G]`` in the rewards' dtype. Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k max@k (spec 12).
    """
    validation.check_tensor("rewards", rewards)
    weights = _resolve_k(k, k_weights, estimators.get("maxk"))
    k = tables.largest_k(weights) if weights is not None else k
    values, layout = _metric_values(rewards.detach(), k, offsets, lengths, group_ids, small_groups)
    return _metric(values, layout, k, small_groups, rewards.dtype, weights)


# ----------------------------------------------------------------------------- helpers

def _metric_values(t, k, offsets, lengths, group_ids, small_groups):
    validation.check_k(k)
    small_code = validation.small_groups_code(small_groups)
    layout = make_layout(t, offsets=offsets, lengths=lengths, group_ids=group_ids, check=True)
    values = layout.pack(t)
    if values.dtype == torch.bool or not values.is_floating_point():
        values = values.to(torch.float64)
    validation.check_finite("rewards", values, layout)
    if small_code == 0:
        validation.check_group_sizes(layout, k, estimators.get("maxk"), allow_empty=False)
    return values, layout


def _metric(values, layout, k, small_groups, dtype, weights=None):
    small_code = validation.small_groups_code(small_groups)
    if weights is None:
        result = reference.max_at_k_packed(values, layout.offsets, min(k, KERNEL_K_MAX), small_code)
    else:
        bank, index = tables.build_bank("maxk", weights, tables.bank_sizes(layout.offsets), small_code,
                                        values.device)
        result = reference.max_at_k_packed(values, layout.offsets, k, small_code, bank, index)
    return result.to(dtype if dtype in FLOAT_DTYPES else torch.float64)
