"""Launcher of the fused advantages kernel, registered as a torch op that torch.compile can trace.

`advantages_packed` is the backend interface of the project brief (packed values + CSR offsets).
It launches exactly one kernel and, when the caller passes max_group_size, never syncs with the host.
Eagerly it launches the kernel directly, under the values' device and on its current stream; under
torch.compile it calls the registered op `torch.ops.bonkernels.triton_advantages`
(torch.library.triton_op + wrap_triton), which the compiler traces into the graph.
"""

from __future__ import annotations

import functools
import os
import struct
from contextlib import nullcontext
from typing import Optional

import torch
import triton
from torch._subclasses.fake_tensor import FakeTensor

from . import _config, _facts, _sources
from ._advantages_kernel import advantages_kernel

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


def estimator_for_launch(code: int, deltas, bank):
    """The registry entry of `code`, refusing what the kernel cannot do with these arguments."""
    est = _facts.by_code(code)
    if est is None:
        raise ValueError(f"unknown estimator code {code} for backend='triton'")
    if not _facts.in_kernel(est):
        raise ValueError(f"estimator {est.name!r} is not available with backend='triton'; "
                         "use backend='torch'")
    if est.needs_deltas and deltas is None:
        raise ValueError(f"estimator {est.name!r} needs deltas (pi_theta/pi_old - 1 per sample)")
    if bank is not None and not _facts.linear_in_tables(est):
        raise ValueError(f"estimator {est.name!r} takes no mixture bank (k_weights)")
    return est


def launch_arguments(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi,
                     mean_scale, small_groups, eps, block, bank=None, bank_index=None):
    """(grid, positional arguments, keyword arguments) of the kernel launch."""
    launch, config, grid, args = _prepared(values, offsets, deltas, out, k, code, clamp_delta, clip_lo,
                                           clip_hi, mean_scale, small_groups, eps, block, bank, bank_index)
    return grid, args, dict(launch.kwargs(config, _config.serial_on(values)))


def _prepared(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
              small_groups, eps, block, bank, bank_index, traced=False):
    """(PreparedLaunch, launch configuration, grid, positional arguments) of one launch."""
    launch = PreparedLaunch(estimator_for_launch(code, deltas, bank), k, clamp_delta, clip_lo, clip_hi,
                            mean_scale, small_groups, eps, block, bank is not None)
    return (launch, *launch.arguments(values, offsets, deltas, out, bank, bank_index, traced))


class PreparedLaunch:
    """Everything of a launch but its tensors, computed once: the scalar arguments, the launch
    configuration of each layout, and (on a GPU) the compiled kernels, which a plan's calls then
    launch directly.

    Triton's own launch (`kernel[grid](...)`) binds and specialises every argument and compares
    every global constant of the kernel on each call: tens of microseconds, several times the
    kernel of a small batch. Every integer argument of the kernel is unspecialised and no pointer
    is specialised on alignment, so for one estimator, dtype and launch configuration the compiled
    kernel is always the same and can be kept after its first launch. A launch takes, from its
    first call, the kernel compiled for its estimator (`specialised_kernel`), with the same
    arguments."""

    def __init__(self, est, k, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps, block,
                 has_bank):
        # k is the kernels' 32-bit k: advantages_packed caps it, and a plan's Params hold it capped
        self.est = est
        self.block = block
        self.has_bank = has_bank
        self.constants = _sources.constants_of(est, has_bank)
        self.serial_block = _config.serial_lanes_up_to(est, has_bank)
        self.scalars = ((int(k),) + self.constants.values()
                        + (int(small_groups), int(clamp_delta is not None),
                           float64_bits(clamp_delta if clamp_delta is not None else 0.0),
                           float64_bits(clip_lo), float64_bits(clip_hi), int(mean_scale), float64_bits(eps)))
        # (CUDA device index, launch configuration, specialised) -> the compiled kernel
        self._compiled = {}
        self.direct_launches = 0  # (the GPU check asks whether launches went direct
        self.specialised_launches = 0  # and whether launches ran their estimator's kernel)

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def kwargs(config: _config.LaunchConfig, serial: bool = False) -> dict:
        """The launch options and constexprs of a configuration (Triton's keyword arguments) for
        the kernel with every estimator; `serial`: its SERIAL (_config.serial_on)."""
        return dict(num_warps=config.num_warps, SERIAL=serial, **config.constexprs())

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def constexpr_values(config: _config.LaunchConfig, serial: bool = False) -> tuple:
        """The constexprs as the compiled launcher takes them: after the others, in signature order."""
        kwargs = PreparedLaunch.kwargs(config, serial)
        return tuple(kwargs[name] for name in advantages_kernel.arg_names if name in kwargs)

    def arguments(self, values, offsets, deltas, out, bank, bank_index, traced=False):
        """(launch configuration, grid, positional arguments) for these tensors; `traced`: for
        torch.compile's launch, which runs the kernel with every estimator."""
        num_groups = offsets.numel() - 1
        own_kernel = runs_own_kernel(values.is_cuda, num_groups, traced)
        config = _config.config_for(self.block, self.est.needs_deltas, num_groups,
                                    _config.takes_own_kernel_lanes(own_kernel, values.dtype),
                                    self.est.centred, self.serial_block)
        # Tensors the kernel does not read still need a pointer of the right type: deltas only for
        # the off-policy estimators, the bank only in bank mode.
        deltas_arg = deltas if self.est.needs_deltas else values
        bank_arg = bank if self.has_bank else values.new_empty(1, dtype=torch.float64)
        bank_index_arg = bank_index if self.has_bank else offsets
        args = (values, deltas_arg, offsets, out, bank_arg, bank_index_arg,
                num_groups, values.numel(), offsets.stride(0), bank_index_arg.numel()) + self.scalars
        return config, (triton.cdiv(num_groups, config.groups),), args

    def launch(self, config, grid, args, values):
        """Launch on the values' device and its current stream: on a GPU the kernel compiled for
        the estimator (_sources.py); with `_config.specialised_kernels(False)`, Triton's own
        launch until its kernel is compiled there, then that kernel directly. Either goes through
        Triton's runner when a profiler's launch hooks are set."""
        fits = _compiled_kernel_fits(values.is_cuda, args[6])
        specialised = runs_own_kernel(values.is_cuda, args[6])
        key = (values.device.index, config, specialised)
        compiled = self._compiled.get(key) if fits else None
        if specialised and compiled is None:
            compiled = self._compiled[key] = specialised_kernel(
                key[0], _config.TRITON_DTYPE_NAMES[values.dtype], config, self.constants)
        hooks = _launch_hooks_set()
        serial = _config.serial_on(values)
        if compiled is None or (hooks and not specialised):
            with _launch_guard(values):
                compiled = advantages_kernel[grid](*args, **self.kwargs(config, serial))
            launchable = _directly_launchable(compiled, len(args) + len(self.constexpr_values(config, serial)))
            if fits and launchable:
                self._compiled[key] = compiled
            return
        index = key[0]
        # (a kernel compiled for the estimator takes SERIAL on; the one Triton's launch compiled
        # has it as passed)
        arguments = args + self.constexpr_values(config, specialised or serial)
        with _config.device_guard(values) if torch._C._cuda_getDevice() != index else nullcontext():
            stream = torch._C._cuda_getCurrentRawStream(index)
            if specialised:
                self.specialised_launches += 1
            if hooks:  # a profiler's hooks: Triton's runner of the compiled kernel calls them
                compiled[(grid[0], 1, 1)](*arguments, stream=stream)
                return
            self.direct_launches += 1
            compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         *arguments)


def _compiled_kernel_fits(on_gpu: bool, num_groups: int) -> bool:
    """Whether a launch can take a kept or specialised kernel: on a GPU, and with a count of
    groups within int32 (beyond, the argument's type changes: Triton's launch specialises it)."""
    return on_gpu and num_groups < 2**31


def runs_own_kernel(on_gpu: bool, num_groups: int, traced: bool = False) -> bool:
    """Whether a launch runs the kernel compiled for its estimator (which also picks its layout,
    `arguments`): on a GPU within int32 groups, not traced by torch.compile, with
    `_config.specialised_kernels` on."""
    return not traced and _compiled_kernel_fits(on_gpu, num_groups) and _config.SPECIALISED_KERNELS


@functools.lru_cache(maxsize=None)
def specialised_kernel(device_index: int, dtype_name: str, config: _config.LaunchConfig,
                       constants: _sources.EstimatorConstants):
    """The kernel of a launch configuration compiled for one estimator on a device, loaded there
    (kept for the process: a training run launches a few)."""
    with torch.cuda.device(device_index):
        target = triton.runtime.driver.active.get_current_target()
        compiled = _sources.compile_for(dtype_name, config, target, constants)
        compiled._init_handles()
    return compiled


def _launch_hooks_set() -> bool:
    """A profiler's launch hooks (Triton's knobs) need Triton's own launch, which calls them.
    Triton 3.6 keeps them as chains that are never None: a hook is set when a chain has calls."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return True
    hooks = (getattr(runtime, "launch_enter_hook", None), getattr(runtime, "launch_exit_hook", None))
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


def _directly_launchable(compiled, num_arguments: int) -> bool:
    """Whether a launch returned a loaded, compiled kernel of the shape PreparedLaunch calls
    (Triton 3.x): its launcher, its function handle, and one parameter per argument passed."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    return (getattr(compiled, "function", None) is not None and hasattr(compiled, "packed_metadata")
            and signature is not None and len(signature) == num_arguments and callable(compiled.run))


def _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, bank, bank_index, wrap):
    launch, config, grid, args = _prepared(values, offsets, deltas, out, k, code, clamp_delta, clip_lo,
                                           clip_hi, mean_scale, small_groups, eps, block, bank, bank_index,
                                           traced=wrap is not None)
    if wrap is None:  # eager
        launch.launch(config, grid, args, values)
        return
    with _launch_guard(values):  # traced by torch.compile: the generic kernel, Triton's launch
        wrap(advantages_kernel)[grid](*args, **launch.kwargs(config, _config.serial_on(values)))


def _launch_guard(values):
    """The values' device (and so its current stream) for a real launch; nothing while tracing
    (the compiler's generated launch code sets the device itself)."""
    if isinstance(values, FakeTensor) or torch.compiler.is_compiling():
        return nullcontext()
    return _config.device_guard(values)


def _new_output(values: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(values)


@torch.library.triton_op("bonkernels::triton_advantages", mutates_args=())
def triton_advantages(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor],
                      k: int, code: int, clamp_delta: Optional[float], clip_lo: float,
                      clip_hi: float, mean_scale: bool, small_groups: int, eps: float,
                      block: int, bank: Optional[torch.Tensor] = None,
                      bank_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The kernel as a torch op; `block` is the power-of-two bucket of the largest group."""
    out = torch.empty_like(values)
    if values.numel() == 0 or offsets.numel() <= 1:
        return out
    _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, bank, bank_index, torch.library.wrap_triton)
    return out


def _direct(values, offsets, deltas, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, bank, bank_index):
    """The same launch without the op wrapper (the interpreter's functions are not JITFunctions)."""
    out = _new_output(values)
    if values.numel() == 0 or offsets.numel() <= 1:
        return out
    _launch(values, offsets, deltas, out, k, code, clamp_delta, clip_lo, clip_hi, mean_scale,
            small_groups, eps, block, bank, bank_index, None)
    return out


def prepare(k: int, estimator_code: int, clamp_delta: Optional[float], clip_lo: float, clip_hi: float,
            mean_scale: bool, small_groups: int, eps: float, max_group_size: int, *,
            bank: Optional[torch.Tensor] = None, bank_index: Optional[torch.Tensor] = None):
    """`advantages_packed` with everything but the tensors fixed: returns call(values, offsets,
    deltas) for a plan (bonkernels/plan.py), which has checked the arguments with a checked call.
    Values of any contiguous shape are read flat; the result has their shape. Eager only."""
    est = estimator_for_launch(estimator_code, True, bank)  # (a plan passes the deltas it needs)
    launch = PreparedLaunch(est, k, clamp_delta, clip_lo, clip_hi, mean_scale, small_groups, eps,
                            _config.block_for(max(int(max_group_size), 0)), bank is not None)

    def call(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor]) -> torch.Tensor:
        values = values.contiguous()
        out = torch.empty_like(values)
        if values.numel() == 0 or offsets.numel() <= 1:
            return out
        config, grid, args = launch.arguments(values, offsets, None if deltas is None else deltas.contiguous(),
                                              out, bank, bank_index)
        launch.launch(config, grid, args, values)
        return out

    call.launch = launch
    return call


def advantages_packed(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor],
                      k: int, estimator_code: int, clamp_delta: Optional[float], clip_lo: float,
                      clip_hi: float, mean_scale: bool, small_groups: int, eps: float,
                      max_group_size: Optional[int] = None, *, bank: Optional[torch.Tensor] = None,
                      bank_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Advantages of a packed batch (the backend interface); see docs/conventions.md.

    max_group_size=None costs one host sync to find the largest group. With check_inputs=False
    upstream, a max_group_size below the largest group gives NaN for the groups above the launch's
    block (never memory outside the output). `bank`/`bank_index`: a k mixture's weight tables.

    The argument checks are bonkernels.validation's (bk.advantages runs them); this internal entry
    point keeps only the ones that protect memory: device, dtype, shapes, contiguity, the bank
    (the estimator is checked in `launch_arguments`; any small_groups code but 2 zeroes a group).
    """
    _check_device(values)
    if values.dtype not in _config.VALUE_DTYPES:
        raise TypeError(f"backend='triton' takes float16/bfloat16/float32/float64 rewards, "
                        f"got {values.dtype}")
    if values.dim() != 1 or not values.is_contiguous():
        raise ValueError("advantages_packed takes a contiguous 1-D values tensor")
    if deltas is not None and (deltas.shape != values.shape or not deltas.is_contiguous()):
        raise ValueError("deltas must be a contiguous tensor shaped like values")
    if offsets.dtype != torch.int64 or offsets.device != values.device or offsets.dim() != 1:
        raise ValueError("offsets must be a 1-D int64 tensor on the values' device")
    if bank is not None and (bank.dtype != torch.float64 or bank_index is None
                             or bank_index.dtype != torch.int64 or bank.device != values.device
                             or bank_index.device != values.device or not bank.is_contiguous()
                             or not bank_index.is_contiguous()):
        raise ValueError("bank must be a contiguous float64 tensor with a contiguous int64 "
                         "bank_index, both on the values' device")
    if max_group_size is None:
        sizes = offsets[1:] - offsets[:-1]
        max_group_size = int(sizes.max()) if sizes.numel() else 0
    block = _config.block_for(max(int(max_group_size), 0))
    # k beyond int32 behaves like any k > n (and would change the kernel's argument type)
    k = min(int(k), 2**31 - 1)
    args = (values, offsets, deltas, k, int(estimator_code),
            None if clamp_delta is None else float(clamp_delta), float(clip_lo), float(clip_hi),
            bool(mean_scale), int(small_groups), float(eps), block, bank, bank_index)
    if interpreting() or not torch.compiler.is_compiling():
        # eager: launch directly (the op's dispatch costs microseconds a small batch feels);
        # the interpreter's kernels cannot go through wrap_triton at all
        return _direct(*args)
    return triton_advantages(*args)
