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
# An on-policy lane launch that runs its estimator's own kernel (on a GPU, _sources.py) holds only
# that estimator's tiles, so it keeps a thread per group up to this larger block, for 16- and 32-bit
# rewards. At BLOCK = 32 that kernel issues 4-7x fewer instructions per sample than the spread
# layout (maxk_loo1 and grpo; static counts, sm_90, not yet timed on a GPU); float64 rewards sort
# in two passes with gathers and spill more there.
OWN_KERNEL_LANE_MAX_BLOCK = 32
# The own kernel of an estimator computed from the group's centre alone (the registry's `centred`
# field) neither sorts nor weights by rank: a thread holds the rewards and their centred float64
# values alone, which fit one block further without a spill (sm_90, float32: 206-212 registers at
# BLOCK = 64, test_triton.py checks it for every centred estimator). grpo there issues 69
# instructions per sample against 560 in the spread layout (static counts).
CENTRED_LANE_MAX_BLOCK = 64
# From a bank, the registry's `one_pass` estimators (rank tables summed in one direction) go
# through a group a column at a time where a thread holds it (the kernel's `_serial_from_bank` and
# `_serial_outputs`), with the tables read a few columns at a time: no whole table is alive.
# Their own kernels then keep a thread per group up to SERIAL_LANE_MAX_BLOCK, off-policy
# included, without a spill (sm_90, float32; test_triton.py checks it), but for those of
# SERIAL_SPILL_ABOVE_32, which spill at 64 (maxk_offpolicy 516 bytes) and stop at 32.
# Static counts (sm_90): maxk_offpolicy at 32 issues 103 instructions per sample against 604 in
# the spread layout; maxk at 64, 87 against 538; maxk_loo1 at 64, 105 against 700.
SERIAL_LANE_MAX_BLOCK = 64
SERIAL_SPILL_ABOVE_32 = ("maxk_offpolicy",)
# Whether launches take the blocks above LANE_MAX_BLOCK as lanes: None, when they run their own
# kernel (above); True, always (the interpreter's tests, and the GPU check's kernel with every
# estimator, which must give the same bits); False, never. See `own_kernel_lanes`.
OWN_KERNEL_LANES = None
LANE_WARPS = 1  # warps per program in lane mode: 32 groups each, so G = 1024 fills 32 programs
# A thread per group pays only on a batch that fills the GPU: fewer groups leave most SMs idle,
# each thread running a whole group's serial chain, and the spread layout is faster. Measured on
# an H200 at n = 16 (kernel time, maxk_loo1): spread 4.0 / 4.2 us against lanes 5.7 / 5.8 us at
# G = 1,024 / 4,096; lanes 8.5 against 9.1 us at 16,384 and 2x faster from 65,536.
LANE_MIN_GROUPS = 8192
# A launch on a GPU runs the kernel compiled for its estimator (_sources.py): the same arithmetic
# with every other estimator's code folded away, in far fewer registers in either layout. Off
# (`specialised_kernels(False)`): the kernel with every estimator, which torch.compile's traced
# launches always take.
SPECIALISED_KERNELS = True
# SERIAL (the kernel's constexpr) compiles the column-at-a-time path of the `one_pass` estimators: on in the kernels compiled per estimator, off in the kernel with every estimator
# on a GPU. Under the interpreter (CPU tensors) that kernel takes it too: the interpreter has no
# registers to save, and CPU tests then run the code that a GPU launch of those estimators runs.
# `interpreter_serial(False)` runs the tile code there instead (a test compares the two, bit for bit).
INTERPRETER_SERIAL = True
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


def config_for(block: int, deltas: bool, num_groups: int, own_kernel: bool = False,
               centred: bool = False, serial_block: int = 0) -> LaunchConfig:
    """The launch of `num_groups` groups in a block: a thread per group only from
    LANE_MIN_GROUPS groups up (read at each call: `lane_threshold` changes it); `own_kernel`,
    `centred` and `serial_block`: see `lanes_up_to`."""
    return config_for_block(block, deltas, bool(num_groups >= LANE_MIN_GROUPS), own_kernel, centred,
                            serial_block)


def takes_own_kernel_lanes(runs_own_kernel: bool, dtype: torch.dtype) -> bool:
    """Whether a launch takes lanes up to OWN_KERNEL_LANE_MAX_BLOCK: when it runs its estimator's
    own kernel on 16- or 32-bit rewards, unless `own_kernel_lanes` says otherwise."""
    if OWN_KERNEL_LANES is not None:
        return OWN_KERNEL_LANES
    return runs_own_kernel and dtype != torch.float64


def lanes_up_to(deltas: bool, own_kernel: bool, centred: bool = False, serial_block: int = 0) -> int:
    """The largest block a launch runs with a thread per group. With `own_kernel` (see
    takes_own_kernel_lanes): `serial_block` (serial_lanes_up_to) where that is larger; else, on
    policy, CENTRED_LANE_MAX_BLOCK when the estimator is `centred` (the registry's field) and
    OWN_KERNEL_LANE_MAX_BLOCK otherwise. LANE_MAX_BLOCK for any other launch."""
    if not own_kernel:
        return LANE_MAX_BLOCK
    if deltas:
        return max(LANE_MAX_BLOCK, serial_block)
    return max(CENTRED_LANE_MAX_BLOCK if centred else OWN_KERNEL_LANE_MAX_BLOCK, serial_block)


def serial_lanes_up_to(est, has_bank: bool) -> int:
    """The block up to which a registry entry's own kernel takes lanes a column at a time: for a
    `one_pass` estimator called from a bank, SERIAL_LANE_MAX_BLOCK (32 for SERIAL_SPILL_ABOVE_32);
    0 otherwise."""
    if not (has_bank and est.one_pass):
        return 0
    return OWN_KERNEL_LANE_MAX_BLOCK if est.name in SERIAL_SPILL_ABOVE_32 else SERIAL_LANE_MAX_BLOCK


def estimator_lanes_up_to(est, own_kernel: bool = True, has_bank: bool = False) -> int:
    """lanes_up_to for a registry entry: from its deltas, whether it is centred, and whether it
    is called from a bank."""
    return lanes_up_to(est.needs_deltas, own_kernel, est.centred, serial_lanes_up_to(est, has_bank))


@contextlib.contextmanager
def lane_threshold(min_groups: int):
    """Launches in this context take a thread per group from `min_groups` groups up (tests and
    the GPU check run both layouts on small batches with it)."""
    global LANE_MIN_GROUPS
    saved, LANE_MIN_GROUPS = LANE_MIN_GROUPS, min_groups
    try:
        yield
    finally:
        LANE_MIN_GROUPS = saved


@contextlib.contextmanager
def own_kernel_lanes(enabled):
    """Launches in this context take the blocks up to their lanes_up_to as lanes always
    (True), never (False), or when they run their own kernel (None, the default)."""
    global OWN_KERNEL_LANES
    saved, OWN_KERNEL_LANES = OWN_KERNEL_LANES, enabled
    try:
        yield
    finally:
        OWN_KERNEL_LANES = saved


@contextlib.contextmanager
def specialised_kernels(enabled: bool):
    """GPU launches in this context run the estimator's own kernel (True) or the kernel with
    every estimator (False; the GPU check compares the two bit for bit)."""
    global SPECIALISED_KERNELS
    saved, SPECIALISED_KERNELS = SPECIALISED_KERNELS, bool(enabled)
    try:
        yield
    finally:
        SPECIALISED_KERNELS = saved


def serial_on(values: torch.Tensor) -> bool:
    """SERIAL for a launch of the kernel with every estimator on these values (see INTERPRETER_SERIAL)."""
    return INTERPRETER_SERIAL and not values.is_cuda


@contextlib.contextmanager
def interpreter_serial(enabled: bool):
    """Under the interpreter, launches in this context run the column-at-a-time path (True) or
    the tile code (False)."""
    global INTERPRETER_SERIAL
    saved, INTERPRETER_SERIAL = INTERPRETER_SERIAL, bool(enabled)
    try:
        yield
    finally:
        INTERPRETER_SERIAL = saved


@functools.lru_cache(maxsize=None)
def config_for_block(block: int, deltas: bool = True, lanes: bool = True,
                     own_kernel: bool = False, centred: bool = False,
                     serial_block: int = 0) -> LaunchConfig:
    """The launch of a block; `deltas`: whether the estimator reads deltas (only the
    thread-per-group kernels leave the off-policy branch out when it does not); `lanes`: whether
    a thread per group may be used (the batch has enough groups, see config_for); `own_kernel`,
    `centred` and `serial_block`: whether a launch may take lanes above LANE_MAX_BLOCK, and up
    to which block (lanes_up_to)."""
    if lanes and block <= lanes_up_to(deltas, own_kernel, centred, serial_block):
        # one group per thread, a group's tables, sort and scans in its registers
        return LaunchConfig(block, 32 * LANE_WARPS, LANE_WARPS, True, deltas)
    # at least 512 elements per program, 2-4 per thread: many warps keep the sort's code small
    # (compile time grows with the elements per thread) and give big groups enough threads
    groups = max(1, 512 // block)
    return LaunchConfig(block, groups, min(spread_warps_cap(block), max(4, groups * block // 64)), False)


def spread_warps_cap(block: int) -> int:
    """The most warps of a spread program: 16 (512 threads, so 128 registers a thread) up to
    BLOCK = 2048. There 32 warps capped a thread at 64 registers, and 7 of the 23 estimators' own
    kernels spilled at float32 (17 at float64); with 16, 1 (3), and they issue 17-51 % fewer
    instructions a group (sm_90, static counts), though with half the warps on an SM to hide
    latency. BLOCK = 4096 keeps 32: with 16 a thread holds 8 samples a tile, and as many kernels
    spill."""
    return 32 if block >= MAX_BLOCK else 16


def all_configs() -> list[LaunchConfig]:
    """Every launch configuration, smallest block first: three per thread-per-group block (lanes
    with and without the off-policy branch, and the spread layout of small batches), one per
    other block."""
    return list(dict.fromkeys(config_for_block(block, deltas, lanes) for block in all_blocks()
                              for lanes in (True, False) for deltas in (False, True)))


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
