"""The public ops: argument checks, layout conversion, and dispatch to a backend.

Every backend implements the same packed interface, ``advantages_packed(values, offsets, deltas, k,
estimator_code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps, max_group_size)``
(docs/conventions.md). Dispatch happens here, before any kernel runs.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Optional, Tuple

import torch

from . import estimators, reference, tables
from .groups import GroupLayout, make_layout

BACKENDS = ("auto", "torch", "cpu", "cuda", "triton")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SMALL_GROUP_CODES = {"error": 0, "zero": 1, "clamp": 2}


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
        k: the target of pass@k / max@k (a Python int >= 1; ignored by ``tang_loo``, ``grpo``,
            ``rloo``, ``dr_grpo``, ``bon_max_mean``, ``bon_max_second``, ``maxrl``, which may
            leave it None). Must be None when ``k_weights`` is given.
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
            the host; with False the op is sync-free and invalid groups give undefined values.
        max_group_size: optional host-side bound on the group size, so kernels need not compute it.

    Returns:
        advantages with the shape and dtype of ``rewards``; padded tail positions are 0.
    """
    est = estimators.get(estimator)
    _check_rewards(rewards, allow_integer=False)
    weights = _resolve_k(k, k_weights, est)
    if weights is not None:
        k = tables.largest_k(weights)
    elif k is None:
        k = 1                                  # ignored by this estimator
    if scale not in ("sum", "mean"):
        raise ValueError(f"scale must be 'sum' or 'mean', got {scale!r}")
    small_code = _small_groups_code(small_groups)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid backends: {', '.join(BACKENDS)}")
    if not isinstance(eps, (int, float)) or not eps >= 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if clamp_delta is not None and not (isinstance(clamp_delta, (int, float)) and clamp_delta > 0):
        raise ValueError(f"clamp_delta must be a positive number or None, got {clamp_delta!r}")
    if clamp_delta is not None and not est.needs_deltas:
        raise ValueError(f"clamp_delta only applies to the off-policy estimators; {estimator!r} takes no deltas")
    clip_lo, clip_hi = _resolve_clip(clip, est)
    if max_group_size is not None and not (isinstance(max_group_size, int) and max_group_size >= 0):
        raise ValueError(f"max_group_size must be a non-negative int or None, got {max_group_size!r}")

    layout = make_layout(rewards, offsets=offsets, lengths=lengths, group_ids=group_ids, check=check_inputs)
    values = layout.pack(rewards).contiguous()
    packed_deltas = _pack_deltas(deltas, rewards, layout, est)
    if max_group_size is None and layout.kind in ("full", "padded"):
        max_group_size = rewards.shape[1]          # a free bound: kernels need not look for it

    if check_inputs:
        _check_finite("rewards", values, layout)
        if est.binary:
            _check_binary(values, layout, est.name)
        if est.name == "maxrl":
            _check_non_negative(values, layout, est.name)
        if packed_deltas is not None:
            _check_finite("deltas", packed_deltas, layout)
            _check_deltas_range(packed_deltas, layout)
        if est.uses_k and small_code == 0:
            _check_group_sizes(layout, k, est)
        if max_group_size is not None:
            sizes = layout.offsets[1:] - layout.offsets[:-1]
            if sizes.numel() and int(sizes.max()) > max_group_size:
                g = int((sizes > max_group_size).nonzero()[0])
                raise ValueError(f"max_group_size={max_group_size} but {layout.describe(g)} has "
                                 f"{int(sizes[g])} samples")

    if check_inputs and max_group_size is None and values.is_cuda:
        sizes = layout.offsets[1:] - layout.offsets[:-1]
        max_group_size = int(sizes.max()) if sizes.numel() else 0   # already synced: give kernels the bound
    if weights is not None and est.name in tables.SUM_OVER_K_ESTIMATORS:
        _select_backend(backend, values, est, max_group_size)       # the backend checks only
        out = _sum_over_k(values, layout, packed_deltas, weights, est, clamp_delta, clip_lo, clip_hi,
                          scale == "mean", small_code, float(eps), max_group_size)
        return layout.unpack(out)
    impl = _select_backend(backend, values, est, max_group_size, mixture=weights is not None)
    extra = {}
    if weights is not None:
        sizes = tables.bank_sizes(layout.offsets, max_group_size,
                                  rewards.shape[1] if layout.kind == "full" else None)
        extra["bank"], extra["bank_index"] = tables.build_bank(est.name, weights, sizes, small_code, values.device)
    out = impl(values, layout.offsets, packed_deltas, k, est.code, clamp_delta, clip_lo, clip_hi,
               scale == "mean", small_code, float(eps), max_group_size, **extra)
    return layout.unpack(out)


def _resolve_k(k, k_weights, est: estimators.Estimator):
    """The normalized mixture weights (None for a single k), after checking k against them."""
    if k_weights is None:
        if k is None:
            if est.uses_k:
                raise TypeError(f"estimator {est.name!r} needs k (an int >= 1) or k_weights")
            return None
        _check_k(k)
        return None
    if k is not None:
        raise ValueError("give either k or k_weights, not both (k_weights already says which k count)")
    if est.name not in tables.MIXABLE_ESTIMATORS:
        kind = "ignores k" if not est.uses_k else "is not linear in its weight tables"
        raise ValueError(f"k_weights (a mixture over k) does not apply to {est.name!r}, which {kind}; "
                         f"mixtures run for {', '.join(tables.MIXABLE_ESTIMATORS)}")
    return tables.normalize_k_weights(k_weights)


def _sum_over_k(values, layout, deltas, weights, est, clamp_delta, clip_lo, clip_hi, mean_scale,
                small_code, eps, max_group_size):
    """A mixture for an estimator without a table bank: sum_k w_k A^(k) of reference calls."""
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    total = torch.zeros(values.shape, dtype=torch.float64, device=values.device)
    for k, w in enumerate(weights, start=1):
        if w == 0:
            continue
        part = reference.advantages_packed(values.to(torch.float64), layout.offsets,
                                           None if deltas is None else deltas.to(torch.float64), k,
                                           est.code, clamp_delta, -math.inf, math.inf, mean_scale, 2, eps,
                                           max_group_size)
        total += w * part
    if small_code != 2:                        # zero (and unchecked error): the largest k decides
        too_small = sizes - est.k_margin < tables.largest_k(weights)
        sample_group = torch.repeat_interleave(too_small, sizes)
        total = torch.where(sample_group, torch.zeros_like(total), total)
    return total.clamp(clip_lo, clip_hi).to(values.dtype)


def pass_at_k(correct: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
              group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased pass@k per group (Chen et al. 2021): 1 - C(n-c, k)/C(n, k).

    ``correct`` holds 0/1 values (bool, integer or float). Returns ``[G]`` in the input's float
    dtype (float64 for bool/integer input). Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k pass@k (spec 12).
    """
    _check_rewards(correct, allow_integer=True)
    weights = _resolve_k(k, k_weights, estimators.get("maxk"))
    k = tables.largest_k(weights) if weights is not None else k
    values, layout = _metric_values(correct, k, offsets, lengths, group_ids, small_groups)
    _check_binary(values, layout, "pass_at_k")
    return _metric(values, layout, k, small_groups, correct.dtype, weights)


def max_at_k(rewards: torch.Tensor, k: Optional[int] = None, *, k_weights=None, offsets=None, lengths=None,
             group_ids=None, small_groups: str = "error") -> torch.Tensor:
    """Unbiased max@k per group: the mean over all k-subsets of the subset's best reward.

    Returns ``[G]`` in the rewards' dtype. Groups are in layout order (ascending id for group_ids).
    With ``k_weights`` (instead of k): the mixed metric sum_k w_k max@k (spec 12).
    """
    _check_rewards(rewards, allow_integer=False)
    weights = _resolve_k(k, k_weights, estimators.get("maxk"))
    k = tables.largest_k(weights) if weights is not None else k
    values, layout = _metric_values(rewards, k, offsets, lengths, group_ids, small_groups)
    return _metric(values, layout, k, small_groups, rewards.dtype, weights)


# ----------------------------------------------------------------------------- helpers

def _metric_values(t, k, offsets, lengths, group_ids, small_groups):
    _check_k(k)
    small_code = _small_groups_code(small_groups)
    layout = make_layout(t, offsets=offsets, lengths=lengths, group_ids=group_ids, check=True)
    values = layout.pack(t)
    if values.dtype == torch.bool or not values.is_floating_point():
        values = values.to(torch.float64)
    _check_finite("rewards", values, layout)
    if small_code == 0:
        _check_group_sizes(layout, k, estimators.get("maxk"), allow_empty=False)
    return values, layout


def _metric(values, layout, k, small_groups, dtype, weights=None):
    small_code = _small_groups_code(small_groups)
    if weights is None:
        result = reference.max_at_k_packed(values, layout.offsets, k, small_code)
    else:
        bank, index = tables.build_bank("maxk", weights, tables.bank_sizes(layout.offsets), small_code,
                                        values.device)
        result = reference.max_at_k_packed(values, layout.offsets, k, small_code, bank, index)
    return result.to(dtype if dtype in FLOAT_DTYPES else torch.float64)


def _check_rewards(rewards, allow_integer: bool) -> None:
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dtype in FLOAT_DTYPES:
        return
    if allow_integer and (rewards.dtype == torch.bool or not rewards.is_floating_point()) \
            and not rewards.is_complex():
        return
    raise TypeError(f"rewards must be float16, bfloat16, float32 or float64, got {rewards.dtype}"
                    + ("" if allow_integer else " (convert integer rewards with .float())"))


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be a Python int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def _small_groups_code(small_groups: str) -> int:
    if small_groups not in _SMALL_GROUP_CODES:
        raise ValueError(f"small_groups must be one of {', '.join(estimators.SMALL_GROUP_MODES)}, "
                         f"got {small_groups!r}")
    return _SMALL_GROUP_CODES[small_groups]


def _resolve_clip(clip, est: estimators.Estimator) -> Tuple[float, float]:
    if clip is None:
        if est.name == "bon_rlb":
            return estimators.BON_RLB_DEFAULT_CLIP
        return (-math.inf, math.inf)
    try:
        lo, hi = (float(clip[0]), float(clip[1]))
        if len(clip) != 2:
            raise ValueError
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"clip must be a (lo, hi) pair of numbers, got {clip!r}") from None
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"clip must satisfy lo <= hi, got {clip!r}")
    return lo, hi


def _pack_deltas(deltas, rewards: torch.Tensor, layout: GroupLayout, est: estimators.Estimator):
    if not est.needs_deltas:
        if deltas is not None:
            raise ValueError(f"estimator {est.name!r} does not use deltas; only maxk_offpolicy and "
                             "maxk_offpolicy_exact take them")
        return None
    if deltas is None:
        raise ValueError(f"estimator {est.name!r} needs deltas (pi_theta/pi_old - 1 per sample)")
    if not isinstance(deltas, torch.Tensor):
        raise TypeError(f"deltas must be a torch.Tensor, got {type(deltas).__name__}")
    if deltas.dtype not in FLOAT_DTYPES:
        raise TypeError(f"deltas must be a floating-point tensor, got {deltas.dtype}")
    if deltas.shape != rewards.shape:
        raise ValueError(f"deltas must have the shape of rewards {tuple(rewards.shape)}, got {tuple(deltas.shape)}")
    if deltas.device != rewards.device:
        raise ValueError(f"deltas are on {deltas.device} but rewards are on {rewards.device}")
    return layout.pack(deltas).to(rewards.dtype).contiguous()


def _first_group(mask: torch.Tensor, layout: GroupLayout) -> Optional[str]:
    bad = mask.nonzero()
    if not bad.numel():
        return None
    return layout.describe(layout.group_of(int(bad[0])))


def _check_finite(name: str, values: torch.Tensor, layout: GroupLayout) -> None:
    where = _first_group(~torch.isfinite(values), layout)
    if where:
        raise ValueError(f"{name} contain NaN or inf in {where}")


def _check_binary(values: torch.Tensor, layout: GroupLayout, name: str) -> None:
    where = _first_group((values != 0) & (values != 1), layout)
    if where:
        raise ValueError(f"{name} needs binary rewards (exactly 0 or 1); {where} has other values")


def _check_non_negative(values: torch.Tensor, layout: GroupLayout, name: str) -> None:
    where = _first_group(values < 0, layout)
    if where:
        raise ValueError(f"{name} needs rewards >= 0 (its advantage divides by the group's mean reward); "
                         f"{where} has a negative reward")


def _check_deltas_range(deltas: torch.Tensor, layout: GroupLayout) -> None:
    where = _first_group(deltas < -1, layout)
    if where:
        raise ValueError(f"deltas must be >= -1 (a probability ratio minus 1); {where} has a smaller value")


def _check_group_sizes(layout: GroupLayout, k: int, est: estimators.Estimator, allow_empty: bool = True) -> None:
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    too_small = sizes - est.k_margin < k
    if allow_empty:
        too_small &= sizes > 0
    bad = too_small.nonzero()
    if bad.numel():
        g = int(bad[0])
        limit = "k <= n - 1" if est.k_margin else "k <= n"
        raise ValueError(f"{est.name} needs {limit}, but k = {k} and {layout.describe(g)} has "
                         f"n = {int(sizes[g])}; pass small_groups='zero' or 'clamp' to allow it")


def _select_backend(backend: str, values: torch.Tensor, est: estimators.Estimator,
                    max_group_size: Optional[int], mixture: bool = False):
    """The packed implementation to call. ``auto`` picks the fastest available for the device.

    For a mixture over k the backend must take the table bank (``bank=``/``bank_index=``); ``auto``
    falls back to the reference when the fastest one does not.
    """
    impl = _select_single_k_backend(backend, values, est, max_group_size)
    if mixture and not accepts_bank(impl):
        if backend != "auto":
            raise ValueError(f"backend={backend!r} does not implement mixtures over k (k_weights) yet; "
                             "use backend='torch' or 'auto'")
        return reference.advantages_packed
    return impl


def accepts_bank(impl) -> bool:
    """True when a backend's advantages_packed takes the mixture bank (interface: bank=, bank_index=)."""
    try:
        return "bank" in inspect.signature(impl).parameters
    except (TypeError, ValueError):
        return False


def _select_single_k_backend(backend: str, values: torch.Tensor, est: estimators.Estimator,
                             max_group_size: Optional[int]):
    if est.name == "maxk_offpolicy_exact":
        if backend not in ("auto", "torch"):
            raise ValueError("maxk_offpolicy_exact runs only on the torch reference backend "
                             f"(backend='auto' or 'torch'), not {backend!r}")
        return reference.advantages_packed
    if backend == "torch":
        return reference.advantages_packed
    if backend == "auto":
        return _auto_backend(values, max_group_size, est)
    if backend == "triton":
        return _triton_backend(values)
    return _native_backend(backend, values)


def _native_backend(backend: str, values: torch.Tensor):
    """The compiled extension's op, with a clear error when it cannot serve this tensor."""
    wanted = "cuda" if backend == "cuda" else "cpu"
    if values.is_cuda != (wanted == "cuda"):
        raise ValueError(f"backend={backend!r} needs {'CUDA' if wanted == 'cuda' else 'CPU'} tensors, "
                         f"but rewards are on {values.device}")
    try:
        from . import _native
    except ImportError as error:  # the module itself is missing: a broken install
        raise RuntimeError(f"backend={backend!r} is unavailable: {error}") from error
    ok = _native.cuda_available() if wanted == "cuda" else _native.available()
    if not ok:
        raise RuntimeError(f"backend={backend!r} is unavailable: the compiled extension "
                           f"{'has no CUDA kernels' if wanted == 'cuda' and _native.available() else 'is not built'}"
                           f" ({_native.load_error() or 'built without CUDA'}). Reinstall with "
                           "`pip install --no-build-isolation -e .`, or use backend='torch'.")
    return _native.advantages_packed


def _triton_backend(values: torch.Tensor):
    try:
        from . import triton as triton_backend
    except ImportError as error:
        raise RuntimeError(f"backend='triton' is unavailable: {error}") from error
    if not triton_backend.available():
        raise RuntimeError("backend='triton' is unavailable: Triton is not installed")
    if not values.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the kernels on "
                         f"the CPU through Triton's interpreter); rewards are on {values.device}")
    return triton_backend.advantages_packed


def _native_knows(est: estimators.Estimator) -> bool:
    """Whether the compiled extension implements this estimator (an extension built before a newer
    registry entry does not); ``auto`` then uses the reference instead. Probed once per code."""
    if est.code not in _NATIVE_KNOWS:
        from . import _native
        values = torch.zeros(2, dtype=torch.float64)
        deltas = torch.zeros_like(values) if est.needs_deltas else None
        try:
            _native.advantages_packed(values, torch.tensor([0, 2]), deltas, 1, est.code, None, -math.inf,
                                      math.inf, False, 2, 1e-6, 2)
            _NATIVE_KNOWS[est.code] = True
        except (ValueError, RuntimeError):
            _NATIVE_KNOWS[est.code] = False
    return _NATIVE_KNOWS[est.code]


_NATIVE_KNOWS = {}


def _auto_backend(values: torch.Tensor, max_group_size: Optional[int], est: estimators.Estimator):
    """Fastest available: the native kernel for the tensor's device, then Triton on CUDA, then torch.

    The GPU kernels take groups up to a fixed size (4096); with a known larger bound auto falls
    back to the reference. With no bound known, the native kernel finds it (one host sync).
    """
    try:
        from . import _native
    except ImportError:
        _native = None
    if _native is not None and _native.available() and not _native_knows(est):
        return reference.advantages_packed
    if not values.is_cuda:
        if _native is not None and _native.available():
            return _native.advantages_packed
        return reference.advantages_packed
    if _native is not None and _native.cuda_available() and (
            max_group_size is None or max_group_size <= _native.CUDA_MAX_GROUP):
        return _native.advantages_packed
    try:
        from . import triton as triton_backend
        if triton_backend.available() and max_group_size is not None \
                and max_group_size <= triton_backend.MAX_GROUP_SIZE:
            return triton_backend.advantages_packed
    except ImportError:
        pass
    return reference.advantages_packed
