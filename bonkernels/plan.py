"""A prepared advantages call: ``bk.advantages`` for one call shape, checked and dispatched once.

A training loop calls ``bk.advantages`` with the same estimator, k, options and group size every
step. Each call re-runs the argument checks, builds the layout, picks the backend and looks up the
table bank: tens of microseconds of Python, more than the kernels take on a small batch. A plan does
all of that once, on a probe batch of one group, and then each call only checks the tensor's shape,
dtype and device and launches the backend's op:

    plan = bk.prepare_advantages(4, "maxk_loo1", group_size=16, device="cuda")
    for step in ...:
        A = plan(rewards)            # rewards [G, 16], any G; the same values as bk.advantages

A call of a plan is ``bk.advantages(rewards, ...)`` with ``check_inputs=False`` and
``max_group_size=group_size``: values are not checked (a NaN reward gives its group NaN, as the
native kernels' NaN contract says), nothing syncs with the host, and it can be captured in a CUDA
graph. Everything that does not depend on the values is checked when the plan is made, k against
the group size included, with bk.advantages's own errors.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import estimators, ops
from .groups import full_offsets


class AdvantagesPlan:
    """See :func:`prepare_advantages`. Call it with ``[G, group_size]`` rewards (and deltas)."""

    def __init__(self, call: "ops._Call", group_size: int, dtype: torch.dtype, device: torch.device):
        self.estimator = call.est.name
        self.backend = call.row.name
        self.group_size = group_size
        self.dtype = dtype
        self.device = device
        self._needs_deltas = call.est.needs_deltas
        self._impl = call.row.impl
        self._args = call.params.args()
        self._bank = call.bank
        prepare = call.row.prepare  # binds the arguments once (None for the reference)
        self._run = None if prepare is None else prepare(*self._args, **self._bank)

    def __call__(self, rewards: torch.Tensor, deltas: Optional[torch.Tensor] = None) -> torch.Tensor:
        n = self.group_size
        if rewards.dim() != 2 or rewards.shape[1] != n:
            raise ValueError(f"this plan takes [G, {n}] rewards, got shape {tuple(rewards.shape)}")
        if rewards.dtype != self.dtype or rewards.device != self.device:
            raise ValueError(f"this plan takes {self.dtype} rewards on {self.device}, got {rewards.dtype} "
                             f"on {rewards.device}")
        if (deltas is not None) != self._needs_deltas:
            raise ValueError(f"{self.estimator} {'needs' if self._needs_deltas else 'takes no'} deltas")
        G = rewards.shape[0]
        if rewards.requires_grad:
            rewards = rewards.detach()
        if deltas is not None:
            if deltas.shape != rewards.shape or deltas.device != rewards.device:
                raise ValueError(f"deltas must be shaped like the rewards {tuple(rewards.shape)} on "
                                 f"{rewards.device}, got {tuple(deltas.shape)} on {deltas.device}")
            deltas = deltas.detach().to(self.dtype)
        offsets = full_offsets(G, n, self.device)
        if self._run is None or torch.compiler.is_compiling():
            # the backend interface on packed values (what torch.compile traces)
            flat_deltas = None if deltas is None else deltas.reshape(-1)
            return self._impl(rewards.reshape(-1), offsets, flat_deltas, *self._args, **self._bank).view(G, n)
        return self._run(rewards, offsets, deltas)  # reads [G, n] as it is and returns [G, n]

    def __repr__(self) -> str:
        return (f"AdvantagesPlan({self.estimator!r}, group_size={self.group_size}, backend={self.backend!r}, "
                f"dtype={self.dtype}, device={self.device})")


def prepare_advantages(k: Optional[int] = None, estimator: str = "maxk_loo1", *, group_size: int,
                       k_weights=None, clamp_delta: Optional[float] = None,
                       clip: Optional[Tuple[float, float]] = None, scale: str = "mean",
                       backend: str = "auto", small_groups: str = "error", eps: float = 1e-6,
                       dtype: torch.dtype = torch.float32, device="cpu") -> AdvantagesPlan:
    """``bk.advantages`` for ``[G, group_size]`` rewards of one dtype and device, prepared once.

    The arguments are those of :func:`bonkernels.advantages` (rewards excepted), plus the group
    size, dtype and device of the rewards the plan will take. They are checked now, by a checked
    call on one group of zeros (so k against group_size, the backend against the device and the
    estimator, as bk.advantages would); a bad one raises bk.advantages's error here. The returned
    plan's ``plan(rewards, deltas=None)`` equals ``bk.advantages(rewards, k, estimator, ...,
    check_inputs=False, max_group_size=group_size)`` for any number of groups G. Not for
    ``maxk_offpolicy_exact`` with ``k_weights`` (a sum of reference calls: use bk.advantages).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    probe = torch.zeros(1, group_size, dtype=dtype, device=device)
    needs_deltas = estimators.get(estimator).needs_deltas
    try:
        call = ops._resolve_call(probe, k, estimator, k_weights=k_weights, offsets=None, lengths=None,
                                 group_ids=None, deltas=torch.zeros_like(probe) if needs_deltas else None,
                                 clamp_delta=clamp_delta, clip=clip, scale=scale, backend=backend,
                                 small_groups=small_groups, eps=eps, check_inputs=True,
                                 max_group_size=group_size)
    except ValueError as error:  # said of the probe group: say which plan
        raise ValueError(f"prepare_advantages for groups of {group_size}: {error}") from error
    if call.row is None:
        raise ValueError(f"a mixture of {estimator!r} is a sum of reference calls: use bk.advantages "
                         "for it (a plan runs one backend op)")
    return AdvantagesPlan(call, group_size, probe.dtype, probe.device)
