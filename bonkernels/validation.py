"""Argument and value checks, written once for every public entry point.

``advantages``, ``pass_at_k``, ``max_at_k``, ``policy_loss``, ``maxk_objective`` and the
integrations call these; the kernels keep only their own bounds guards. Two kinds of check:

* argument checks (types, ranges, option names): host-only, never touch tensor data;
* value checks (finite, binary, group sizes): read the data, so they synchronise with a GPU. They
  run only with ``check_inputs=True`` and name the first offending group.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import torch

from . import estimators
from .groups import GroupLayout

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SCALES = ("sum", "mean")
SMALL_GROUP_CODES = {"error": 0, "zero": 1, "clamp": 2}
# Devices a tensor may live on: data must be readable (no "meta"), and every backend runs on these.
SUPPORTED_DEVICE_TYPES = ("cpu", "cuda")


# ----------------------------------------------------------------------------- arguments

def is_real_number(x) -> bool:
    """A real Python or numpy number, not a bool and not a string."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_tensor(name: str, t, *, allow_integer: bool = False) -> None:
    """``t`` is a tensor on a supported device with a floating dtype (or 0/1-capable integer/bool)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_device(name, t)
    if t.dtype in FLOAT_DTYPES:
        return
    if allow_integer and (t.dtype == torch.bool or not t.is_floating_point()) and not t.is_complex():
        return
    raise TypeError(f"{name} must be float16, bfloat16, float32 or float64 (a floating-point dtype), got {t.dtype}"
                    + ("" if allow_integer else " (convert integer rewards with .float())"))


def check_device(name: str, t: torch.Tensor) -> None:
    if t.device.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"{name} is on the {t.device.type!r} device, which bonkernels does not support "
                         f"(supported: {', '.join(SUPPORTED_DEVICE_TYPES)})"
                         + ("; a meta tensor holds no values to compute with" if t.device.type == "meta" else ""))


def check_same_device(name: str, t: torch.Tensor, like_name: str, like: torch.Tensor) -> None:
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {like_name} is on {like.device}")


def check_k(k) -> int:
    """k is a Python int >= 1 (not a bool, not a float). Any size is fine: rules compare it to n."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be a Python int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def small_groups_code(small_groups) -> int:
    if not isinstance(small_groups, str) or small_groups not in SMALL_GROUP_CODES:
        raise ValueError(f"small_groups must be one of {', '.join(estimators.SMALL_GROUP_MODES)}, "
                         f"got {small_groups!r}")
    return SMALL_GROUP_CODES[small_groups]


def check_scale(scale) -> bool:
    """True for the mean scale."""
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"scale must be 'sum' or 'mean', got {scale!r}")
    return scale == "mean"


def check_eps(eps) -> float:
    if not is_real_number(eps) or not eps >= 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def check_clamp_delta(clamp_delta, est: estimators.Estimator) -> Optional[float]:
    if clamp_delta is None:
        return None
    if not is_real_number(clamp_delta) or not clamp_delta > 0:
        raise ValueError(f"clamp_delta must be a positive number or None, got {clamp_delta!r}")
    if not est.needs_deltas:
        raise ValueError(f"clamp_delta only applies to the off-policy estimators; {est.name!r} takes no deltas")
    return float(clamp_delta)


def resolve_clip(clip, est: estimators.Estimator) -> Tuple[float, float]:
    """``(lo, hi)`` of real numbers with lo <= hi; the estimator's default clip (or none) when None."""
    if clip is None:
        return est.default_clip if est.default_clip is not None else (-math.inf, math.inf)
    if isinstance(clip, (str, bytes)) or not hasattr(clip, "__len__") or len(clip) != 2 \
            or not all(is_real_number(c) for c in clip):
        raise ValueError(f"clip must be a (lo, hi) pair of numbers, got {clip!r}")
    lo, hi = float(clip[0]), float(clip[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"clip must satisfy lo <= hi, got {clip!r}")
    return lo, hi


def check_max_group_size(max_group_size) -> Optional[int]:
    if max_group_size is None:
        return None
    if isinstance(max_group_size, bool) or not isinstance(max_group_size, numbers.Integral) or max_group_size < 0:
        raise ValueError(f"max_group_size must be a non-negative int or None, got {max_group_size!r}")
    return int(max_group_size)


def check_choice(name: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}: {name} must be one of {', '.join(choices)}")


def check_deltas_argument(deltas, rewards: torch.Tensor, est: estimators.Estimator) -> None:
    """Deltas are given exactly for the off-policy estimators, shaped and placed like the rewards."""
    if not est.needs_deltas:
        if deltas is not None:
            takers = ", ".join(e.name for e in estimators.REGISTRY.values() if e.needs_deltas)
            raise ValueError(f"estimator {est.name!r} does not use deltas; only {takers} take them")
        return
    if deltas is None:
        raise ValueError(f"estimator {est.name!r} needs deltas (pi_theta/pi_old - 1 per sample)")
    if not isinstance(deltas, torch.Tensor):
        raise TypeError(f"deltas must be a torch.Tensor, got {type(deltas).__name__}")
    if deltas.dtype not in FLOAT_DTYPES:
        raise TypeError(f"deltas must be a floating-point tensor, got {deltas.dtype}")
    if deltas.shape != rewards.shape:
        raise ValueError(f"deltas must have the shape of rewards {tuple(rewards.shape)}, got {tuple(deltas.shape)}")
    check_same_device("deltas", deltas, "rewards", rewards)


# ----------------------------------------------------------------------------- values (host syncs)

def first_group(mask: torch.Tensor, layout: GroupLayout) -> Optional[str]:
    """A description of the group of the first True entry of a per-sample mask, or None."""
    bad = mask.nonzero()
    if not bad.numel():
        return None
    return layout.describe(layout.group_of(int(bad[0])))


def check_finite(name: str, values: torch.Tensor, layout: GroupLayout) -> None:
    where = first_group(~torch.isfinite(values), layout)
    if where:
        raise ValueError(f"{name} contain NaN or inf in {where} ({name} must be finite)")


def check_binary(values: torch.Tensor, layout: GroupLayout, name: str) -> None:
    where = first_group((values != 0) & (values != 1), layout)
    if where:
        raise ValueError(f"{name} needs binary rewards (exactly 0 or 1); {where} has other values")


def check_non_negative(values: torch.Tensor, layout: GroupLayout, name: str) -> None:
    where = first_group(values < 0, layout)
    if where:
        raise ValueError(f"{name} needs rewards >= 0 (its advantage divides by the group's mean reward); "
                         f"{where} has a negative reward")


def check_deltas_range(deltas: torch.Tensor, layout: GroupLayout) -> None:
    where = first_group(deltas < -1, layout)
    if where:
        raise ValueError(f"deltas must be >= -1 (a probability ratio minus 1); {where} has a smaller value")


def check_group_sizes(layout: GroupLayout, k: int, est: estimators.Estimator, allow_empty: bool = True) -> None:
    """Every (non-empty) group is large enough for k under the estimator's k rule."""
    sizes = layout.offsets[1:] - layout.offsets[:-1]
    too_small = sizes - est.k_margin < min(k, 2 ** 62)   # k may exceed int64; no group is that large
    if allow_empty:
        too_small &= sizes > 0
    bad = too_small.nonzero()
    if bad.numel():
        g = int(bad[0])
        limit = "k <= n - 1" if est.k_margin else "k <= n"
        raise ValueError(f"{est.name} needs {limit}, but k = {k} and {layout.describe(g)} has "
                         f"n = {int(sizes[g])}; pass small_groups='zero' or 'clamp' to allow it")


def check_values(values: torch.Tensor, layout: GroupLayout, est: estimators.Estimator, k: int,
                 small_code: int, deltas: Optional[torch.Tensor] = None,
                 max_group_size: Optional[int] = None) -> None:
    """The value checks of ``advantages`` (packed rewards and deltas), first offending group named."""
    check_finite("rewards", values, layout)
    if est.binary:
        check_binary(values, layout, est.name)
    if est.non_negative:
        check_non_negative(values, layout, est.name)
    if deltas is not None:
        check_finite("deltas", deltas, layout)
        check_deltas_range(deltas, layout)
    if est.uses_k and small_code == 0:
        check_group_sizes(layout, k, est)
    if max_group_size is not None:
        sizes = layout.offsets[1:] - layout.offsets[:-1]
        if sizes.numel() and int(sizes.max()) > max_group_size:
            g = int((sizes > max_group_size).nonzero()[0])
            raise ValueError(f"max_group_size={max_group_size} but {layout.describe(g)} has "
                             f"{int(sizes[g])} samples")


# ----------------------------------------------------------------------------- trainer integrations

def check_trainer_estimator(estimator, trainer: str, *, k=None, k_weights=None, scale=None, eps=None,
                            k_hint: str = "pass k=...", check_k_given: bool = True) -> estimators.Estimator:
    """The checks every trainer integration makes before its advantage step: an on-policy estimator
    (the step has no current-policy log-probs), k or k_weights as the estimator needs (not both),
    and a valid scale and eps (``check_k_given=False``: the k arguments are checked later). ``k``
    may come from a config file or the environment, so integral strings are left to the caller's
    int(); everything else goes through the same checks as ``bk.advantages``."""
    est = estimators.get(estimator)
    if est.needs_deltas:
        raise ValueError(f"{est.name} needs the current policy's log-probs, which {trainer}'s advantage step "
                         "does not have; use bonkernels.policy_loss in the policy loss instead")
    if check_k_given and k is not None and k_weights is not None:
        raise ValueError("give either k or k_weights, not both")
    if check_k_given and k_weights is None and est.uses_k and k is None:
        raise ValueError(f"{est.name} needs k (the pass@k / max@k target): {k_hint}")
    if k is not None and not isinstance(k, str):
        check_k(k)
    if scale is not None:
        check_scale(scale)
    if eps is not None:
        check_eps(eps)
    return est
