"""What the compiler is given for one kernel specialisation: the argument types, the constexprs,
and for the thread-per-group layout the estimator's own constants.

Shared by the ahead-of-time compile check (aot.py), the launcher (advantages.py) and the static
report (bench/static_kernels.py), so all three build exactly the same kernels.

Specialised lane kernels. A thread that holds a whole group keeps every tile of every estimator
the kernel implements in its registers, although one call runs one estimator: 236 registers at
BLOCK = 16 for the on-policy kernel, so 8 warps per SM and a latency-bound kernel. Compiled with
the estimator's facts as constants (its code, k rule, natural scale, whether it sorts and whether
the call reads a bank), the other estimators' code folds away: at float32 and BLOCK = 16,
maxk_loo1 from a bank needs 165 registers, grpo 113, maxrl 85 (`python -m bonkernels.triton.aot
--estimators` lists them all). That leaves room for one block more: these launches keep a thread
per group at BLOCK = 32 (16- and 32-bit rewards, _config.OWN_KERNEL_LANE_MAX_BLOCK), where the
kernel with every estimator spills about 2 KB a thread; some estimators' own kernels spill there too
(maxk_loo up to 376 bytes loaded), and test_triton.py bounds it. The centred estimators' own
kernels (grpo, rloo, dr_grpo, maxrl), which neither sort nor build tables, keep a thread per
group at BLOCK = 64 as well (_config.CENTRED_LANE_MAX_BLOCK), without a spill. The source is the
same kernel and the constants only remove branches, so the arithmetic is the same (the GPU check
compares the two kernels bit for bit, in the same layout, up to BLOCK = 32; the kernel with every
estimator never takes lanes at 64, so there the check compares the own kernel with the float64
reference only); a launch compiles the
specialisation it needs on first use (about a second) and keeps it. The spread layout (larger
blocks, small batches) keeps its one kernel per block and dtype: its tiles are spread over many
threads and do not crowd registers.
Off-policy lane launches (maxk_offpolicy, up to BLOCK = 16) run their estimator's kernel too:
at BLOCK = 16 it fits without a spill, where the kernel with every estimator spills 76/144 bytes
stored/loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import _config, _facts

# The kernel's arguments that are facts of the estimator (and of the call's bank mode) rather than
# of the batch, in signature order: constants of a specialised lane kernel.
ESTIMATOR_ARGUMENTS = ("code", "k_margin", "uses_k", "natural_mean", "has_bank", "sorts")


def specialised_per_estimator(config: _config.LaunchConfig) -> bool:
    """Whether launches of this configuration run a kernel compiled for their estimator."""
    return config.lanes


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
        "LANES": "constexpr", "DELTAS": "constexpr",
    }
    if constants is not None:
        types.update({name: "constexpr" for name in ESTIMATOR_ARGUMENTS})
    return types


def source(dtype_name: str, config: _config.LaunchConfig,
           constants: Optional[EstimatorConstants] = None):
    """The ASTSource of one specialisation (no attributes: the kernel does not specialise on
    pointer alignment or integer values). The launcher passes `constants` for lane launches only;
    the static report also builds them at larger blocks."""
    from triton.compiler import ASTSource

    from ._advantages_kernel import advantages_kernel

    constexprs = dict(config.constexprs(), **(constants.as_dict() if constants is not None else {}))
    return ASTSource(fn=advantages_kernel, signature=signature(dtype_name, constants),
                     constexprs=constexprs)


def compile_for(dtype_name: str, config: _config.LaunchConfig, target,
                constants: Optional[EstimatorConstants] = None):
    """The compiled kernel of one specialisation for a GPUTarget (no GPU needed)."""
    import triton

    return triton.compile(source(dtype_name, config, constants), target=target,
                          options={"num_warps": config.num_warps})
