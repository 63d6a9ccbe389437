"""What the compiler is given for one kernel specialisation: the argument types, the constexprs,
and for a launch on a GPU the estimator's own constants.

Shared by the ahead-of-time compile check (aot.py), the launcher (advantages.py) and the static
report (bench/static_kernels.py), so all three build exactly the same kernels.

Kernels compiled per estimator. The kernel with every estimator keeps every estimator's tiles and
branches, although one call runs one estimator. Compiled with the estimator's facts as constants
(its code, k rule, natural scale, whether it sorts and whether the call reads a bank), the other
estimators' code folds away. The source is the same kernel and the constants only remove branches,
so the arithmetic is the same: the GPU check compares the two kernels bit for bit, in the same
layout. A launch on a GPU compiles the specialisation it needs on first use (about a second; 3-5 s
at BLOCK = 4096) and keeps it (`python -m bonkernels.triton.aot --estimators` compiles them all).

* A thread per group (LANES) holds its whole group in registers: 248 registers at BLOCK = 16 for
  the on-policy kernel with every estimator, against 154 for maxk_loo1 from a bank and 82 for
  grpo (sm_90, float32). That leaves room for one block more: on-policy launches keep a thread
  per group at BLOCK = 32 (16- and 32-bit rewards, _config.OWN_KERNEL_LANE_MAX_BLOCK), where the
  kernel with every estimator spills about 2 KB a thread; some estimators' own kernels spill there
  too (maxk_loo up to 376 bytes loaded), and test_triton.py bounds it. The centred estimators' own
  kernels (grpo, rloo, dr_grpo, maxrl), which neither sort nor build tables, keep a thread per
  group at BLOCK = 64 as well (_config.CENTRED_LANE_MAX_BLOCK), without a spill. From a bank,
  maxk, passk, maxk_loo1 and maxk_offpolicy go through a group one column at a time in their own
  kernels (SERIAL, the kernel's constexpr: the kernel with every estimator keeps its tile code),
  so none of them spills in lanes, and they keep a thread per group further
  (_config.serial_lanes_up_to: maxk_offpolicy to 32, where the kernel with every estimator
  spills 2.9/5.1 KB stored/loaded a thread; maxk, passk and maxk_loo1 to 64). The kernel with every estimator never takes
  lanes above 32, so the GPU check compares the kernels at 64 with float64 only.
* A group spread over threads (small batches, larger blocks): the kernel with every estimator
  takes 128 registers and spills at BLOCK = 128 and 1024 (8/8 and 16/24 bytes), where
  every estimator's own kernel fits without a spill up to BLOCK = 1024, in 32-128 registers
  (sm_90, float32), but bon_mean at 256 (4/4 bytes, around a float64 division's slow path). At
  2048 a program has 512 threads (_config.spread_warps_cap), 128 registers a thread: the
  estimators' own kernels take them without a spill, but maxk_offpolicy without a bank (20/20
  bytes), and the kernel with every estimator spills 72/104. At 4096 a program has
  1024 threads, so at most 64 registers a thread: the kernel with every estimator spills 380/884
  bytes there, 13 of the 23 own kernels none to 136/208 (maxk_offpolicy the most).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import _config, _facts

# The kernel's arguments that are facts of the estimator (and of the call's bank mode) rather than
# of the batch, in signature order: constants of a kernel compiled for its estimator.
ESTIMATOR_ARGUMENTS = ("code", "k_margin", "uses_k", "natural_mean", "has_bank", "sorts")


@dataclass(frozen=True)
class EstimatorConstants:
    """The values of ESTIMATOR_ARGUMENTS for one estimator and bank mode."""

    code: int
    k_margin: int
    uses_k: int
    natural_mean: int
    has_bank: int
    sorts: int

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in ESTIMATOR_ARGUMENTS}

    def values(self) -> tuple:
        return tuple(getattr(self, name) for name in ESTIMATOR_ARGUMENTS)


def constants_of(est, has_bank: bool) -> EstimatorConstants:
    """The kernel's estimator arguments for a registry entry and bank mode."""
    return EstimatorConstants(est.code, est.k_margin, int(est.uses_k), int(_facts.natural_mean(est)),
                              int(has_bank), int(not est.order_free))


def signature(dtype_name: str, constants: Optional[EstimatorConstants] = None) -> dict:
    """The kernel's argument types as the launcher passes them (ints are i32: k, codes and group
    counts fit; sizes and strides of the tensors are i64; float scalars travel as i64 bit
    patterns); with `constants`, the estimator's arguments are constexprs."""
    ptr = "*" + dtype_name
    types = {
        "values_ptr": ptr, "deltas_ptr": ptr, "offsets_ptr": "*i64", "out_ptr": ptr,
        "bank_ptr": "*fp64", "bank_index_ptr": "*i64",
        "num_groups": "i32", "num_values": "i64", "offsets_stride": "i64",
        "bank_index_len": "i64", "k": "i32", "code": "i32", "k_margin": "i32", "uses_k": "i32",
        "natural_mean": "i32", "has_bank": "i32", "sorts": "i32", "small_groups": "i32", "has_clamp": "i32",
        "clamp_delta_bits": "i64", "clip_lo_bits": "i64", "clip_hi_bits": "i64",
        "mean_scale": "i32", "eps_bits": "i64",
        "BLOCK": "constexpr", "LOG2_BLOCK": "constexpr", "GROUPS": "constexpr",
        "LANES": "constexpr", "DELTAS": "constexpr", "SERIAL": "constexpr",
    }
    if constants is not None:
        types.update({name: "constexpr" for name in ESTIMATOR_ARGUMENTS})
    return types


def source(dtype_name: str, config: _config.LaunchConfig,
           constants: Optional[EstimatorConstants] = None):
    """The ASTSource of one specialisation (no attributes: the kernel does not specialise on
    pointer alignment or integer values). The launcher passes `constants` for its launches on a
    GPU; without them, the kernel with every estimator."""
    from triton.compiler import ASTSource

    from ._advantages_kernel import advantages_kernel

    constexprs = dict(config.constexprs(), SERIAL=constants is not None,
                      **(constants.as_dict() if constants is not None else {}))
    return ASTSource(fn=advantages_kernel, signature=signature(dtype_name, constants),
                     constexprs=constexprs)


def compile_for(dtype_name: str, config: _config.LaunchConfig, target,
                constants: Optional[EstimatorConstants] = None):
    """The compiled kernel of one specialisation for a GPUTarget (no GPU needed)."""
    import triton

    return triton.compile(source(dtype_name, config, constants), target=target,
                          options={"num_warps": config.num_warps})
