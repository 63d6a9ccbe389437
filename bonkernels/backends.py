"""The backend table of ``bonkernels.advantages``: one row per backend, and ``auto`` as a lookup in it.

Every backend implements the packed interface ``advantages_packed(values, offsets, deltas, k,
estimator_code, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps, max_group_size,
*, bank=None, bank_index=None)`` (docs/conventions.md). A row says where it runs, how large a group
it takes, which estimators it implements (the registry's ``backends`` field), whether it reads the
mixture table bank, and how to load it. The rows are in ``auto``'s order of preference.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from . import estimators, reference

NAMES = ("torch", "cpu", "cuda", "triton")
CHOICES = ("auto",) + NAMES


@dataclass(frozen=True)
class Params:
    """The scalar arguments of one packed call, already checked (bonkernels/validation.py)."""

    k: int                              # a kernel-safe k (see ``kernel_k``)
    code: int
    clamp_delta: Optional[float]
    clip_lo: float
    clip_hi: float
    mean_scale: bool
    small_groups: int
    eps: float
    max_group_size: Optional[int]

    def args(self) -> tuple:
        return (self.k, self.code, self.clamp_delta, self.clip_lo, self.clip_hi, self.mean_scale,
                self.small_groups, self.eps, self.max_group_size)


# No group holds 2^31 samples (the kernels index a group with 32-bit ints), so every k above this
# cap acts like any other k larger than every group: the k rules compare k with n only.
K_CAP = 2 ** 31 - 1


def kernel_k(k: int) -> int:
    """k as the kernels take it (a 32-bit int), with the same meaning for every group."""
    return min(int(k), K_CAP)


@dataclass(frozen=True)
class Backend:
    name: str
    devices: Tuple[str, ...]            # tensor device types it runs on
    _max_group: Callable[[], Optional[int]]   # the largest group it takes (None: any size)
    takes_bank: bool                    # reads bank=/bank_index= (mixtures over k)
    _load: Callable[[], Callable]       # the module function implementing the interface
    _why_unavailable: Callable[[], Optional[str]]
    # its `prepare(*Params.args(), bank=, bank_index=) -> call(values, offsets, deltas)`: the
    # interface with everything but the tensors bound once (a plan's call); None: the reference
    _load_prepare: Optional[Callable[[], Callable]] = None

    def serves(self, est: estimators.Estimator) -> bool:
        return self.name in est.backends

    def runs_on(self, values: torch.Tensor) -> bool:
        if self.name == "triton" and values.device.type == "cpu":
            return os.environ.get("TRITON_INTERPRET") == "1"
        return values.device.type in self.devices

    @property
    def max_group_size(self) -> Optional[int]:
        return self._max_group()

    def fits(self, max_group_size: Optional[int]) -> bool:
        """Whether groups of the known bound fit; an unknown bound fits only an unbounded backend
        or one that finds the bound itself (the native CUDA op, with one host sync)."""
        bound = self.max_group_size
        if bound is None:
            return True
        if max_group_size is None:
            return self.name == "cuda"
        return max_group_size <= bound

    def unavailable(self) -> Optional[str]:
        """Why the backend cannot run here, or None."""
        return self._why_unavailable()

    @property
    def impl(self) -> Callable:
        return self._load()

    @property
    def prepare(self) -> Optional[Callable]:
        return None if self._load_prepare is None else self._load_prepare()


# ----------------------------------------------------------------------------- the rows

def _native():
    try:
        from . import _native as native
    except ImportError:
        return None
    return native


def _native_unavailable(cuda: bool) -> Optional[str]:
    native = _native()
    if native is None:
        return "the bonkernels._native module is missing (a broken install)"
    if cuda and native.cuda_available() or not cuda and native.available():
        return None
    what = "has no CUDA kernels" if cuda and native.available() else "is not built"
    return (f"the compiled extension {what} ({native.load_error() or 'built without CUDA'}). Reinstall "
            "with `pip install --no-build-isolation -e .`, or use backend='torch'")


def _triton_unavailable() -> Optional[str]:
    try:
        from . import triton as triton_backend
    except ImportError as error:
        return str(error)
    return None if triton_backend.available() else "Triton is not installed"


def _load_native():
    from . import _native as native
    return native.advantages_packed


def _load_triton():
    from . import triton as triton_backend
    return triton_backend.advantages_packed


def _load_native_prepare():
    from . import _native as native
    return native.prepare


def _load_triton_prepare():
    from .triton import advantages as triton_advantages
    return triton_advantages.prepare


def _cuda_max_group() -> int:
    from ._native import CUDA_MAX_GROUP
    return CUDA_MAX_GROUP


def _triton_max_group() -> int:
    from .triton import MAX_GROUP_SIZE
    return MAX_GROUP_SIZE


TABLE = (
    Backend("cpu", ("cpu",), lambda: None, True, _load_native, lambda: _native_unavailable(False),
            _load_native_prepare),
    Backend("cuda", ("cuda",), _cuda_max_group, True, _load_native, lambda: _native_unavailable(True),
            _load_native_prepare),
    Backend("triton", ("cuda",), _triton_max_group, True, _load_triton, _triton_unavailable,
            _load_triton_prepare),
    Backend("torch", ("cpu", "cuda"), lambda: None, True, lambda: reference.advantages_packed, lambda: None),
)
ROWS = {b.name: b for b in TABLE}


# ----------------------------------------------------------------------------- selection

def select(backend: str, values: torch.Tensor, est: estimators.Estimator, max_group_size: Optional[int],
           *, mixture: bool = False) -> Backend:
    """The row that runs this call. ``auto``: the first row (cpu, cuda, triton, torch) that is
    available, runs on the values' device, implements the estimator (for a mixture: reads the
    bank) and takes groups of the known size; the reference serves everything else."""
    if backend == "auto":
        return _auto(values, est, max_group_size, mixture)
    row = ROWS[backend]
    if not row.serves(est):
        where = " or ".join(f"'{b}'" for b in ("auto",) + tuple(b for b in NAMES if b in est.backends))
        which = "torch reference" if est.backends == ("torch",) else ", ".join(est.backends)
        raise ValueError(f"{est.name} runs only on the {which} backend (backend={where}), not {backend!r}")
    if not row.runs_on(values):
        if row.name == "triton":
            raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the kernels on "
                             f"the CPU through Triton's interpreter); rewards are on {values.device}")
        need = "CUDA" if row.name == "cuda" else "CPU"
        raise ValueError(f"backend={backend!r} needs {need} tensors, but rewards are on {values.device}")
    why = row.unavailable()
    if why is not None:
        raise RuntimeError(f"backend={backend!r} is unavailable: {why}")
    if mixture and not row.takes_bank:
        raise ValueError(f"backend={backend!r} does not implement mixtures over k (k_weights) yet; "
                         "use backend='torch' or 'auto'")
    return row


def _auto(values, est, max_group_size, mixture) -> Backend:
    native_rows_know = _native_knows(est)
    for row in TABLE:
        if row.name in ("cpu", "cuda") and not native_rows_know:
            continue
        if (row.serves(est) and row.runs_on(values) and row.fits(max_group_size)
                and (not mixture or row.takes_bank) and row.unavailable() is None):
            if row.name == "triton" and values.device.type != "cuda":
                continue                     # auto never picks the interpreter
            return row
    return ROWS["torch"]


_NATIVE_KNOWS = {}


def _native_knows(est: estimators.Estimator) -> bool:
    """Whether the compiled extension implements this estimator (an extension built before a newer
    registry entry does not; ``auto`` then uses the reference). Probed once per code."""
    native = _native()
    if native is None or not native.available():
        return True                          # the native rows are unavailable anyway
    if est.code not in _NATIVE_KNOWS:
        values = torch.zeros(2, dtype=torch.float64)
        deltas = torch.zeros_like(values) if est.needs_deltas else None
        try:
            native.advantages_packed(values, torch.tensor([0, 2]), deltas, 1, est.code, None, -math.inf,
                                     math.inf, False, 2, 1e-6, 2)
            _NATIVE_KNOWS[est.code] = True
        except (ValueError, RuntimeError):
            _NATIVE_KNOWS[est.code] = False
    return _NATIVE_KNOWS[est.code]


def run(row: Backend, values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor],
        params: Params, **bank) -> torch.Tensor:
    """One packed call of the row's implementation."""
    return row.impl(values, offsets, deltas, *params.args(), **bank)
