"""Loading the compiled extension ``bonkernels._C``, with a clear message when it is absent.

The extension registers ``torch.ops.bonkernels.advantages_packed`` (and an ``_out`` variant) for
the CPU and, when compiled in, CUDA dispatch keys. This module adds the fake (meta) implementation
so ``torch.compile(fullgraph=True)`` can trace calls, and exposes the backend interface of
``bonkernels.reference.advantages_packed``.

``import bonkernels`` never needs the extension: ``available()`` says whether it loaded and
``load_error()`` why not.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _codegen
from . import estimators as _estimators

# Largest group the CUDA kernels handle (csrc/cuda/launch.h: BK_CUDA_MAX_GROUP).
CUDA_MAX_GROUP = 4096
# The estimators the native kernels do not implement (reference-only), from the registry.
UNSUPPORTED_CODES = tuple(e.code for e in _estimators.REGISTRY.values() if not _codegen.implemented_natively(e))

_load_error: Optional[str] = None
_ops = None
_cuda_compiled = False
_build_info = 0

try:
    from . import _C  # noqa: F401  (loading it runs the TORCH_LIBRARY registrations)
    _ops = torch.ops.bonkernels
    _build_info = int(_ops.build_info())
    _cuda_compiled = bool(_build_info & 1)
except Exception as error:  # ImportError, or an ABI mismatch with the installed torch
    _load_error = f"{type(error).__name__}: {error}"
    _ops = None

if _ops is not None:
    @torch.library.register_fake("bonkernels::advantages_packed")
    def _advantages_packed_fake(values, offsets, deltas, k, estimator_code, clamp_delta, clip_lo, clip_hi,
                                mean_scale, small_groups, eps, max_group_size, bank=None, bank_index=None):
        return torch.empty_like(values)


def available() -> bool:
    """True when the compiled extension (CPU kernels) loaded."""
    return _ops is not None


def cuda_available() -> bool:
    """True when the extension has CUDA kernels and a CUDA device is usable."""
    return _ops is not None and _cuda_compiled and torch.cuda.is_available()


def build_route() -> Optional[str]:
    """How the loaded extension was built: "torch-cuda" (torch's CUDAExtension), "bare-nvcc" (the
    torch-free .cu files by nvcc, linked with libcudart), "cpu" (no CUDA kernels), or None when it
    did not load. Both CUDA routes launch on torch's current stream under a device guard."""
    if _ops is None:
        return None
    if not _cuda_compiled:
        return "cpu"
    return "torch-cuda" if _build_info & 2 else "bare-nvcc"


def load_error() -> Optional[str]:
    """Why the extension did not load (None when it did)."""
    return _load_error


def _require(values: torch.Tensor) -> None:
    if _ops is None:
        raise RuntimeError(f"bonkernels native extension is not built ({_load_error}); install with "
                           "`pip install --no-build-isolation -e .` or use backend='torch'")
    if values.is_cuda and not _cuda_compiled:
        raise RuntimeError("bonkernels native extension was built without CUDA kernels; rebuild on a machine "
                           "with nvcc and a CUDA torch (or BONKERNELS_FORCE_CUDA=1), or use backend='triton'/'torch'")


def advantages_packed(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor], k: int,
                      estimator_code: int, clamp_delta: Optional[float], clip_lo: float, clip_hi: float,
                      mean_scale: bool, small_groups: int, eps: float,
                      max_group_size: Optional[int] = None, out: Optional[torch.Tensor] = None, *,
                      bank: Optional[torch.Tensor] = None, bank_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The backend interface (same semantics as ``bonkernels.reference.advantages_packed``).

    One fused kernel launch for the whole batch. Contiguous ``values`` of any shape are read flat
    and the result has their shape (a plan passes ``[G, n]`` rewards as they are).
    ``max_group_size`` (a Python int bound on every group size) spares the CUDA path a host sync;
    the CPU path never syncs. With ``out`` the result
    is written into that tensor (every element is written; tests poison it first) and returned.
    ``bank``/``bank_index`` (float64 / int64, on the values' device) are the mixture tables of a
    call with k weights: the linear estimators then read their tables from the block for their
    group size, ignore ``k`` and never zero a group themselves (the too-small rule is folded in).
    """
    _require(values)
    args = (values, offsets, deltas, int(k), int(estimator_code),
            None if clamp_delta is None else float(clamp_delta), float(clip_lo), float(clip_hi),
            bool(mean_scale), int(small_groups), float(eps),
            None if max_group_size is None else int(max_group_size))
    # the bank goes positionally: keywords cost torch's op call about 2 us
    if out is None:
        return _ops.advantages_packed(*args, bank, bank_index)
    _ops.advantages_packed_out(*args, out, bank, bank_index)
    return out


def prepare(k: int, estimator_code: int, clamp_delta: Optional[float], clip_lo: float, clip_hi: float,
            mean_scale: bool, small_groups: int, eps: float, max_group_size: Optional[int], *,
            bank: Optional[torch.Tensor] = None, bank_index: Optional[torch.Tensor] = None):
    """``advantages_packed`` with everything but the tensors fixed and converted once: returns
    call(values, offsets, deltas) for a plan (bonkernels/plan.py), which has checked the arguments
    with a checked call. Values of any contiguous shape are read flat; the result has their shape.

    The call enters the op's C++ directly (``bonkernels._C.prepared_call``), not through torch's
    dispatcher: the same function, without converting 14 Python arguments per call. Eager only
    (torch.compile traces the registered op, which a plan calls there)."""
    if _ops is None:
        _require(torch.empty(0))
    from . import _C

    tail = (int(k), int(estimator_code), None if clamp_delta is None else float(clamp_delta),
            float(clip_lo), float(clip_hi), bool(mean_scale), int(small_groups), float(eps),
            None if max_group_size is None else int(max_group_size), bank, bank_index)
    if not hasattr(_C, "prepared_call"):  # an extension built before the direct entry: the op
        op = _ops.advantages_packed
        return lambda values, offsets, deltas: op(values, offsets, deltas, *tail)
    prepared, prepared_call = _C.prepare(*tail), _C.prepared_call

    def call(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor]) -> torch.Tensor:
        return prepared_call(prepared, values, offsets, deltas)

    return call
