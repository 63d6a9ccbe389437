"""Launch configuration of the advantages kernel: which block, how many groups per program.

Pure Python (no triton import), shared by the launcher and the ahead-of-time compile check, so
the set of specialisations the op can launch is defined in exactly one place.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

MIN_BLOCK = 8
MAX_BLOCK = 4096  # larger groups: use another backend (one group's packed sort fits one program)
LANE_MAX_BLOCK = 16  # a thread per group up to this block (see the kernel's module docstring)
LANE_WARPS = 1  # warps per program in lane mode: 32 groups each, so G = 1024 fills 32 programs
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                      torch.float64: "fp64"}


@dataclass(frozen=True)
class LaunchConfig:
    block: int  # power of two >= every group size of the launch
    groups: int  # groups per program (power of two)
    num_warps: int
    lanes: bool  # a thread per group (see the kernel's module docstring)
    deltas: bool = True  # the off-policy branch compiled in (always, but for on-policy lanes)

    @property
    def log2_block(self) -> int:
        return self.block.bit_length() - 1

    def constexprs(self) -> dict:
        return {"BLOCK": self.block, "LOG2_BLOCK": self.log2_block, "GROUPS": self.groups,
                "LANES": self.lanes, "DELTAS": self.deltas}


def block_for(max_group_size: int) -> int:
    """The power-of-two bucket for a launch whose largest group has max_group_size samples."""
    if max_group_size > MAX_BLOCK:
        raise ValueError(
            f"backend='triton' supports groups of at most {MAX_BLOCK} samples, got a group of "
            f"{max_group_size}; use backend='cuda' or backend='torch' for larger groups")
    block = MIN_BLOCK
    while block < max_group_size:
        block *= 2
    return block


@functools.lru_cache(maxsize=None)
def config_for_block(block: int, deltas: bool = True) -> LaunchConfig:
    """The launch of a block; `deltas`: whether the estimator reads deltas (only the
    thread-per-group kernels leave the off-policy branch out when it does not)."""
    if block <= LANE_MAX_BLOCK:
        # one group per thread, a group's tables, sort and scans in its registers
        return LaunchConfig(block, 32 * LANE_WARPS, LANE_WARPS, True, deltas)
    # at least 512 elements per program, 2-4 per thread: many warps keep the sort's code small
    # (compile time grows with the elements per thread) and give big groups enough threads
    groups = max(1, 512 // block)
    return LaunchConfig(block, groups, min(32, max(4, groups * block // 64)), False)


def all_configs() -> list[LaunchConfig]:
    """Every launch configuration (two per thread-per-group block), smallest block first."""
    return list(dict.fromkeys(config_for_block(block, deltas) for block in all_blocks()
                              for deltas in (False, True)))


def all_blocks() -> list[int]:
    blocks, block = [], MIN_BLOCK
    while block <= MAX_BLOCK:
        blocks.append(block)
        block *= 2
    return blocks


def device_guard(tensor: torch.Tensor):
    """Context in which a launch runs on `tensor`'s device: Triton launches on the current device
    and that device's current torch stream, so a CUDA tensor on another device than the current
    one needs the switch (CPU tensors under the interpreter need nothing)."""
    if tensor.is_cuda:
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()
