"""The backend table: one row per backend of the advantages op, and ``backend="auto"`` as a lookup.

Every backend implements the packed interface of ``bonkernels.reference.advantages_packed``
(docs/conventions.md), including the mixture bank (``bank=``, ``bank_index=``). A row says where
the backend runs, how large a group it takes, and how to load it; which estimators it implements
is the registry's ``backends`` field (bonkernels/estimators.py), so nothing here lists estimators.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from . import estimators, reference

NAMES = ("auto",) + estimators.ALL_BACKENDS


@dataclass(frozen=True)
class Backend:
    name: str
    devices: Tuple[str, ...]                 # device types it runs on
    max_group: Callable[[], Optional[int]]   # largest group it takes (None: any); looked up lazily
    needs_size_hint: bool                    # auto picks it only with a known max_group_size
    load: Callable[[], Callable]             # the implementation, or raises RuntimeError saying why
    what: str                                # for messages and docs

    def runs_on(self, values: torch.Tensor) -> bool:
        if self.name == "triton" and values.device.type == "cpu":
            return os.environ.get("TRITON_INTERPRET") == "1"   # the interpreter runs CPU tensors
        return values.device.type in self.devices

    def fits(self, max_group_size: Optional[int]) -> bool:
        bound = self.max_group()
        if bound is None:
            return True
        if max_group_size is None:
            return not self.needs_size_hint
        return max_group_size <= bound

    def available(self) -> bool:
        try:
            self.load()
            return True
        except RuntimeError:
            return False


def _load_reference():
    return reference.advantages_packed


def _load_native(cuda: bool):
    def load():
        try:
            from . import _native
        except ImportError as error:  # the module itself is missing: a broken install
            raise RuntimeError(f"the compiled extension cannot be imported: {error}") from error
        ok = _native.cuda_available() if cuda else _native.available()
        if not ok:
            why = ("it has no CUDA kernels" if cuda and _native.available()
                   else f"it is not built ({_native.load_error() or 'built without CUDA'})")
            raise RuntimeError(f"the compiled extension is unavailable: {why}. Reinstall with "
                               "`pip install --no-build-isolation -e .`, or use backend='torch'")
        return _native.advantages_packed
    return load


def _load_triton():
    try:
        from . import triton as triton_backend
    except ImportError as error:
        raise RuntimeError(f"the Triton backend cannot be imported: {error}") from error
    if not triton_backend.available():
        raise RuntimeError("Triton is not installed")
    return triton_backend.advantages_packed


def _any_size():
    return None


def _native_cuda_max_group() -> int:
    from . import _native
    return _native.CUDA_MAX_GROUP


def _triton_max_group() -> int:
    from .triton._config import MAX_BLOCK
    return MAX_BLOCK


TABLE = {
    "torch": Backend("torch", ("cpu", "cuda"), _any_size, False, _load_reference,
                     "the PyTorch reference (any device torch runs on)"),
    "cpu": Backend("cpu", ("cpu",), _any_size, False, _load_native(cuda=False),
                   "the compiled C++ kernel"),
    "cuda": Backend("cuda", ("cuda",), _native_cuda_max_group, False, _load_native(cuda=True),
                    "the compiled CUDA kernels"),
    "triton": Backend("triton", ("cuda",), _triton_max_group, True, _load_triton,
                      "the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)"),
}

# backend="auto": the first row, in this order for the tensor's device, that runs there, implements
# the estimator, is available and takes the batch's group size. The reference always qualifies.
AUTO_ORDER = {"cpu": ("cpu", "torch"), "cuda": ("cuda", "triton", "torch")}


def select(name: str, values: torch.Tensor, est: estimators.Estimator,
           max_group_size: Optional[int]) -> Callable:
    """The implementation of backend ``name`` for this call, or a clear error why it cannot run."""
    if name == "auto":
        for candidate in AUTO_ORDER.get(values.device.type, ("torch",)):
            row = TABLE[candidate]
            if candidate in est.backends and row.runs_on(values) and row.fits(max_group_size) \
                    and row.available() and _knows(row, est):
                return row.load()
        return reference.advantages_packed
    if name not in TABLE:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(NAMES)}")
    row = TABLE[name]
    if name not in est.backends:
        raise ValueError(f"{est.name} runs only on the {' or '.join(est.backends)} backend "
                         f"(backend='auto' picks it), not {name!r}")
    if not row.runs_on(values):
        raise ValueError(f"backend={name!r} ({row.what}) cannot run on rewards on {values.device}")
    try:
        return row.load()
    except RuntimeError as error:
        raise RuntimeError(f"backend={name!r} is unavailable: {error}") from error


def _knows(row: Backend, est: estimators.Estimator) -> bool:
    """Whether a compiled extension implements the estimator: one built before a newer registry
    entry does not, and auto then moves on. Probed once per code."""
    if row.name not in ("cpu", "cuda"):
        return True
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
