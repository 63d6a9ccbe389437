"""The public ops: argument checks (validation.py), layout conversion (groups.py), and dispatch to
a row of the backend table (backends.py), before any kernel runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import torch

from . import backends, estimators, reference, tables, validation
from .groups import GroupLayout, make_layout
from .validation import FLOAT_DTYPES

BACKENDS = backends.CHOICES


def advantages(rewards: torch.Tensor, k: Optional[int] = None, estimator: str = "maxk_loo1", *, k_weights=None,
               offsets=None, lengths=None,
               group_ids=None, deltas: Optional[torch.Tensor] = None, clamp_delta: Optional[float] = None,
               clip: Optional[Tuple[float, float]] = None, scale: str = "mean", backend: str = "auto",
               small_groups: str = "error", eps: float = 1e-6, check_inputs: bool = True,
               max_group_size: Optional[int] = None) -> torch.Tensor:
    """Per-sample advantages of every group, from one batched op.

    Args:
        rewards: float16/bfloat16/float32/float64 rewards: ``[G, n]`` (full rows, or a valid prefix
            per row with ``lengths``) or ``[N]`` with ``offsets`` or ``group_ids``.
        k: the target of pass@k / max@k (a Python int >= 1 of any size; ignored by ``tang_loo``,
            ``grpo``, ``rloo``, ``dr_grpo``, ``bon_max_mean``, ``bon_max_second``, ``maxrl``, which
            may leave it None). Must be None when ``k_weights`` is given.
        estimator: one of :data:`bonkernels.ESTIMATORS` (see docs/conventions.md).
        k_weights: a mixture over k (spec 12): a 1-D sequence or tensor ``w`` of finite weights
            >= 0 for k = 1..T, not all zero; the advantages are those of the objective
            ``sum_k w_k max@k``. For the estimators linear in their tables (``maxk``, ``passk``,
            ``maxk_loo``, ``maxk_loo_centered``, ``maxk_loo1``, ``maxk_offpolicy``,
            ``maxk_offpolicy_exact``). The k rules and ``small_groups`` apply to the largest k with
            a non-zero weight ("clamp" moves the weight of too-large k to the largest valid k).
        offsets: int64 ``[G+1]`` CSR offsets into packed ``[N]`` rewards.
        lengths: int ``[G]``, the valid prefix of each row of padded ``[G, n]`` rewards.
        group_ids: integer ``[N]``; samples of a group need not be adjacent.
        deltas: pi_theta/pi_old - 1 per sequence, same shape as rewards; only for the off-policy
            estimators (``maxk_offpolicy``, ``maxk_offpolicy_exact``), which require it.
        clamp_delta: clamp deltas to ``[-c, c]`` before use.
        clip: ``(lo, hi)``: clip the output advantages. ``bon_rlb`` clips to
            ``BON_RLB_DEFAULT_CLIP`` when this is None.
        scale: ``"sum"`` (gradient = sum_i A_i grad log p_i) or ``"mean"`` (``n_g`` times that,
            for losses that average over samples).
        backend: ``"auto"``, ``"torch"`` (the reference), ``"cpu"``, ``"cuda"`` or ``"triton"``.
        small_groups: what to do with a group smaller than k needs: ``"error"`` (default),
            ``"zero"`` (its advantages are 0) or ``"clamp"`` (k is lowered to what the group allows).
        eps: added to the standard deviation by the z-scored estimators (grpo, bon_mean, chen_passk).
        check_inputs: validate values (finite, binary where needed, group sizes). This syncs with
            the host; with False (and a known ``max_group_size``) the op is sync-free, so it can be
            captured in a CUDA graph or traced by ``torch.compile(fullgraph=True)``, and invalid
            groups give undefined values. The ``group_ids`` layout always syncs once (its number
            of groups is the number of distinct ids); use ``offsets`` in a hot loop.
        max_group_size: optional host-side bound on the group size, so kernels need not compute it
            (free for ``[G, n]`` rewards: n).

    Returns:
        advantages with the shape and dtype of ``rewards``; padded tail positions are 0. Advantages
        are constants: ``rewards`` and ``deltas`` are detached on every backend, so the result
        never requires grad and no gradient flows into them.
    """
    call = _resolve_call(rewards, k, estimator, k_weights=k_weights, offsets=offsets, lengths=lengths,
                         group_ids=group_ids, deltas=deltas, clamp_delta=clamp_delta, clip=clip,
                         scale=scale, backend=backend, small_groups=small_groups, eps=eps,
                         check_inputs=check_inputs, max_group_size=max_group_size)
    return call.layout.unpack(call.run())


@dataclasses.dataclass
class _Call:
    """One advantages call, checked and dispatched, ready to run: its packed inputs, the backend
    row with its scalar arguments and table bank, or (row None) a mixture summed over single-k
    reference calls. bonkernels/plan.py keeps all but the tensors for the next calls."""

    est: estimators.Estimator
    layout: GroupLayout
    values: torch.Tensor
    deltas: Optional[torch.Tensor]
    params: backends.Params
    row: Optional[backends.Backend]
    bank: dict
    weights: Optional[tuple]

    def run(self) -> torch.Tensor:
        """The packed advantages."""
        if self.row is None:
            return _sum_over_k(self.values, self.layout, self.deltas, self.weights, self.est, self.params)
        return backends.run(self.row, self.values, self.layout.offsets, self.deltas, self.params, **self.bank)


def _resolve_call(rewards, k, estimator, *, k_weights, offsets, lengths, group_ids, deltas, clamp_delta,
                  clip, scale, backend, small_groups, eps, check_inputs, max_group_size) -> _Call:
    """Every check of bk.advantages, the layout, the backend row and the bank of one call."""
    est = estimators.get(estimator)
    validation.check_tensor("rewards", rewards)
    rewards = rewards.detach()                 # advantages are constants on every backend
    weights = _resolve_k(k, k_weights, est)
    k = tables.largest_k(weights) if weights is not None else (1 if k is None else k)  # None: ignored
    validation.check_choice("backend", backend, backends.CHOICES)
    small_code = validation.small_groups_code(small_groups)
    clip_lo, clip_hi = validation.resolve_clip(clip, est)
    max_group_size = validation.check_max_group_size(max_group_size)
    params = dict(code=est.code, clamp_delta=validation.check_clamp_delta(clamp_delta, est), clip_lo=clip_lo,
                  clip_hi=clip_hi, mean_scale=validation.check_scale(scale), small_groups=small_code,
                  eps=validation.check_eps(eps))
    validation.check_deltas_argument(deltas, rewards, est)

    layout = make_layout(rewards, offsets=offsets, lengths=lengths, group_ids=group_ids, check=check_inputs,
                         flat_padding=not check_inputs)
    values = layout.pack(rewards).contiguous()
    packed_deltas = None if deltas is None else layout.pack(deltas.detach()).to(rewards.dtype).contiguous()
    if max_group_size is None and layout.kind in ("full", "padded", "padded_flat"):
        max_group_size = rewards.shape[1]          # a free bound: kernels need not look for it
    if check_inputs:
        validation.check_values(values, layout, est, k, small_code, packed_deltas, max_group_size)
    if max_group_size is None and (check_inputs and values.is_cuda or values.device.type == "cpu"):
        # Give the kernels the bound: free on the CPU, and the checks on a GPU already synced. The
        # bound also decides whether one k's tables come from a bank (tables.single_k_bank), so a
        # call's result does not depend on whether its caller passed the hint.
        sizes = layout.offsets[1:] - layout.offsets[:-1]
        max_group_size = int(sizes.max()) if sizes.numel() else 0
    params = backends.Params(k=backends.kernel_k(k), max_group_size=max_group_size, **params)

    if weights is not None and est.name in tables.SUM_OVER_K_ESTIMATORS:
        backends.select(backend, values, est, max_group_size)       # the backend checks only
        return _Call(est, layout, values, packed_deltas, params, None, {}, weights)
    row = backends.select(backend, values, est, max_group_size, mixture=weights is not None)
    bank = {}
    full_size = rewards.shape[1] if layout.kind == "full" else None
    if weights is not None:
        sizes = tables.bank_sizes(layout.offsets, max_group_size, full_size)
        bank["bank"], bank["bank_index"] = tables.build_bank(est.name, weights, sizes, small_code, values.device)
    elif row.name in tables.SINGLE_K_BANK_BACKENDS and est.name in tables.BANK_ESTIMATORS:
        # One k's tables, built once per (estimator, k, sizes) and cached, instead of per group.
        one_k = tables.single_k_bank(est.name, params.k, max_group_size, full_size, small_code, values.device)
        if one_k is not None:
            bank["bank"], bank["bank_index"] = one_k
    return _Call(est, layout, values, packed_deltas, params, row, bank, weights)


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


def _sum_over_k(values, layout, deltas, weights, est, params: backends.Params):
    """A mixture for an estimator without a table bank: sum_k w_k A^(k) of reference calls."""
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    total = torch.zeros(values.shape, dtype=torch.float64, device=values.device)
    single = dataclasses.replace(params, clip_lo=-math.inf, clip_hi=math.inf, small_groups=2)
    for k, w in enumerate(weights, start=1):
        if w == 0:
            continue
        part = backends.run(backends.ROWS["torch"], values.to(torch.float64), layout.offsets,
                            None if deltas is None else deltas.to(torch.float64), dataclasses.replace(single, k=k))
        total += w * part
    if params.small_groups != 2:               # zero (and unchecked error): the largest k decides
        too_small = sizes - est.k_margin < tables.largest_k(weights)
        sample_group = torch.repeat_interleave(too_small, sizes)
        total = torch.where(sample_group, torch.zeros_like(total), total)
    return total.clamp(params.clip_lo, params.clip_hi).to(values.dtype)


def pass_at_k(correct: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
              group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased pass@k per group (Chen et al. 2021): 1 - C(n-c, k)/C(n, k).

    ``correct`` holds 0/1 values (bool, integer or float). Returns ``[G]`` in the input's float
    dtype (float64 for bool/integer input). Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k pass@k (spec 12). A metric, not a
    loss: ``correct`` is detached.
    """
    validation.check_tensor("correct", correct, allow_integer=True)
    values, layout, k, weights, small_code = _metric_values(correct.detach(), k, k_weights, offsets, lengths,
                                                            group_ids, small_groups)
    validation.check_binary(values, layout, "pass_at_k")
    return _metric(values, layout, k, small_code, correct.dtype, weights)


def max_at_k(rewards: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
             group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased max@k per group: the mean over all k-subsets of the subset's best reward.

    Returns ``[G]`` in the rewards' dtype. Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k max@k (spec 12). A metric, not a
    loss: ``rewards`` is detached.
    """
    validation.check_tensor("rewards", rewards)
    values, layout, k, weights, small_code = _metric_values(rewards.detach(), k, k_weights, offsets, lengths,
                                                            group_ids, small_groups)
    return _metric(values, layout, k, small_code, rewards.dtype, weights)


# ----------------------------------------------------------------------------- helpers

def _metric_values(t, k, k_weights, offsets, lengths, group_ids, small_groups):
    weights = _resolve_k(k, k_weights, estimators.get("maxk"))
    k = tables.largest_k(weights) if weights is not None else k
    small_code = validation.small_groups_code(small_groups)
    layout = make_layout(t, offsets=offsets, lengths=lengths, group_ids=group_ids, check=True)
    values = layout.pack(t)
    if values.dtype == torch.bool or not values.is_floating_point():
        values = values.to(torch.float64)
    validation.check_finite("rewards", values, layout)
    if small_code == 0:
        validation.check_group_sizes(layout, k, estimators.get("maxk"), allow_empty=False)
    return values, layout, backends.kernel_k(k), weights, small_code


def _metric(values, layout, k, small_code, dtype, weights=None):
    if weights is None:
        result = reference.max_at_k_packed(values, layout.offsets, k, small_code)
    else:
        bank, index = tables.build_bank("maxk", weights, tables.bank_sizes(layout.offsets), small_code,
                                        values.device)
        result = reference.max_at_k_packed(values, layout.offsets, k, small_code, bank, index)
    return result.to(dtype if dtype in FLOAT_DTYPES else torch.float64)
