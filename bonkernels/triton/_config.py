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
RANK_SORT_MAX_BLOCK = 32  # O(n^2) rank-by-comparison below this; tl.sort on packed keys above
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                      torch.float64: "fp64"}


@dataclass(frozen=True)
class LaunchConfig:
    block: int  # power of two >= every group size of the launch
    groups: int  # groups per program (power of two)
    rank_sort: bool
    num_warps: int

    @property
    def log2_block(self) -> int:
        return self.block.bit_length() - 1

    def constexprs(self) -> dict:
        return {"BLOCK": self.block, "LOG2_BLOCK": self.log2_block, "GROUPS": self.groups,
                "RANK_SORT": self.rank_sort}


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
def config_for_block(block: int) -> LaunchConfig:
    if block <= RANK_SORT_MAX_BLOCK:
        # The comparison tile is groups * block * block: 2048 elements (16 per thread), which
        # also keeps programs small enough that G = 1024 groups of 16 fill a GPU (128 programs).
        return LaunchConfig(block, max(1, 2048 // (block * block)), True, 4)
    # at least 512 elements per program, 2-4 per thread: many warps keep the sort's code small
    # (compile time grows with the elements per thread) and give big groups enough threads
    groups = max(1, 512 // block)
    return LaunchConfig(block, groups, False, min(32, max(4, groups * block // 64)))


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
