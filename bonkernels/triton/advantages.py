"""Launcher of the fused advantages kernel, registered as a torch op that torch.compile can trace.

`advantages_packed` is the backend interface of the project brief (packed values + CSR offsets).
It launches exactly one kernel and, when the caller passes max_group_size, never syncs with the host.
Eagerly it launches the kernel directly; under torch.compile it calls the registered op
`torch.ops.bonkernels.triton_advantages` (torch.library.triton_op + wrap_triton), which the
compiler traces into the graph.
"""

from __future__ import annotations

import os
import struct
from typing import Optional

import torch
import triton

from . import _config
from ._advantages_kernel import CODES, advantages_kernel

OFFPOLICY_EXACT_CODE = 5
ESTIMATOR_K_RULES = {  # code -> (uses_k, k_margin); mirrors bonkernels/estimators.py (tests check)
    code: (name not in ("tang_loo", "bon_max_mean", "bon_max_second", "grpo", "rloo", "dr_grpo"),
           1 if name in ("maxk_loo", "maxk_loo_centered") else 0)
    for name, code in CODES.items()
}
SMALL_GROUP_MODES = (0, 1, 2)  # error (already checked), zero, clamp


def float64_bits(x: float) -> int:
    """The IEEE float64 bit pattern of x as a signed int64 (the kernel's float scalar arguments)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_device(values: torch.Tensor) -> None:
    if values.is_cuda:
        return
    if not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors (got a tensor on {values.device}); to run the "
            "Triton kernels on CPU tensors, set TRITON_INTERPRET=1 before triton is imported")


def launch_arguments(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi,
                     mean_scale, small_groups, eps, block):
    """(grid, positional arguments, keyword arguments) of the kernel launch."""
    num_groups = offsets.numel() - 1
    config = _config.config_for_block(block)
    uses_k, k_margin = ESTIMATOR_K_RULES[code]
    grid = (triton.cdiv(num_groups, config.groups),)
    args = (values, deltas if deltas is not None else values, offsets, out, num_groups,
            k, code, k_margin, int(uses_k), small_groups, int(clamp_delta is not None),
            float64_bits(clamp_delta if clamp_delta is not None else 0.0), float64_bits(clip_lo),
            float64_bits(clip_hi), int(mean_scale), float64_bits(eps))
    return grid, args, dict(num_warps=config.num_warps, **config.constexprs())


def _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, wrap):
    grid, args, kwargs = launch_arguments(values, offsets, deltas, out, k, code, clamp_delta,
                                          clip_lo, clip_hi, mean_scale, small_groups, eps, block)
    kernel = wrap(advantages_kernel) if wrap is not None else advantages_kernel
    kernel[grid](*args, **kwargs)


@torch.library.triton_op("bonkernels::triton_advantages", mutates_args=())
def triton_advantages(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor],
                      k: int, code: int, clamp_delta: Optional[float], clip_lo: float,
                      clip_hi: float, mean_scale: bool, small_groups: int, eps: float,
                      block: int) -> torch.Tensor:
    """The kernel as a torch op; `block` is the power-of-two bucket of the largest group."""
    out = torch.empty_like(values)
    if values.numel() == 0 or offsets.numel() <= 1:
        return out
    _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, torch.library.wrap_triton)
    return out


def _direct(values, offsets, deltas, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block):
    """The same launch without the op wrapper (the interpreter's functions are not JITFunctions)."""
    out = torch.empty_like(values)
    if values.numel() == 0 or offsets.numel() <= 1:
        return out
    _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, None)
    return out


def advantages_packed(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor],
                      k: int, estimator_code: int, clamp_delta: Optional[float], clip_lo: float,
                      clip_hi: float, mean_scale: bool, small_groups: int, eps: float,
                      max_group_size: Optional[int]) -> torch.Tensor:
    """Advantages of a packed batch (the backend interface); see docs/conventions.md.

    max_group_size=None costs one host sync to find the largest group.
    """
    _check_device(values)
    if estimator_code == OFFPOLICY_EXACT_CODE:
        raise ValueError("estimator 'maxk_offpolicy_exact' is not available with backend='triton'; "
                         "use backend='torch'")
    if estimator_code not in ESTIMATOR_K_RULES:
        raise ValueError(f"unknown estimator code {estimator_code} for backend='triton'")
    if values.dtype not in _config.VALUE_DTYPES:
        raise TypeError(f"backend='triton' takes float16/bfloat16/float32/float64 rewards, "
                        f"got {values.dtype}")
    if small_groups not in SMALL_GROUP_MODES:
        raise ValueError(f"small_groups must be 0, 1 or 2, got {small_groups!r}")
    if values.dim() != 1 or not values.is_contiguous():
        raise ValueError("advantages_packed takes a contiguous 1-D values tensor")
    if deltas is not None and (deltas.shape != values.shape or not deltas.is_contiguous()):
        raise ValueError("deltas must be a contiguous tensor shaped like values")
    if offsets.dtype != torch.int64 or offsets.device != values.device:
        raise ValueError("offsets must be int64 on the values' device")
    if max_group_size is None:
        sizes = offsets[1:] - offsets[:-1]
        max_group_size = int(sizes.max()) if sizes.numel() else 0
    block = _config.block_for(int(max_group_size))
    # k beyond int32 behaves like any k > n (and would change the kernel's argument type)
    k = min(int(k), 2**31 - 1)
    args = (values, offsets, deltas, k, int(estimator_code),
            None if clamp_delta is None else float(clamp_delta), float(clip_lo), float(clip_hi),
            bool(mean_scale), int(small_groups), float(eps), block)
    if interpreting() or not torch.compiler.is_compiling():
        # eager: launch directly (the op's dispatch costs microseconds a small batch feels);
        # the interpreter's kernels cannot go through wrap_triton at all
        return _direct(*args)
    return triton_advantages(*args)
