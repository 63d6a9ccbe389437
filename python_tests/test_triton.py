"""The Triton backend from the ordinary test process: configuration, registration, the interpreter
suite in a subprocess, and ahead-of-time compilation of every kernel specialisation.

TRITON_INTERPRET must be set before triton is imported and must be unset for real compilation, so
both the interpreter suite and the compile check run in their own processes.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from bonkernels import estimators  # noqa: E402
from bonkernels.triton import _config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
INTERPRETER_SUITES = ("python_tests/test_triton_interpreter.py",
                      "python_tests/test_triton_interpreter_safety.py",
                      "python_tests/test_triton_interpreter_mixtures.py")
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def _run(args, env_update, timeout):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update(env_update)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _tail(result, lines=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-lines:])


# ---------------------------------------------------------------- registry and configuration

def test_kernel_codes_and_facts_come_from_the_registry():
    """The kernel's code constants are the registry's, the launcher passes the registry's facts
    for every estimator, and no second hand-kept table of codes or rules is left."""
    from bonkernels.triton import _advantages_kernel as kernel
    from bonkernels.triton import _facts
    from bonkernels.triton import advantages as launcher

    for e in estimators.REGISTRY.values():
        assert _facts.get(e.name) is e
        constant = getattr(kernel, e.name.upper(), None)
        if _facts.in_kernel(e):
            assert constant is not None and constant.value == e.code, e.name
    for name in ("CODES", "FIRST_MEAN_SCALE_CODE", "FIRST_MEAN_SCALE_CODE_INT"):
        assert not hasattr(kernel, name), name
    for name in ("ESTIMATOR_K_RULES", "OFFPOLICY_EXACT_CODE"):
        assert not hasattr(launcher, name), name
    assert kernel.ZSCORE_CONSTANT_RTOL.value == estimators.ZSCORE_CONSTANT_RTOL
    values = torch.rand(10, dtype=torch.float32)
    offsets = torch.tensor([0, 4, 10])
    names = launcher.advantages_kernel.arg_names
    for e in _facts.kernel_estimators():
        deltas = values if e.needs_deltas else None
        _, args, _ = launcher.launch_arguments(values, offsets, deltas, torch.empty_like(values),
                                               3, e.code, None, -math.inf, math.inf, True, 2,
                                               1e-6, 8)
        passed = dict(zip(names, args))
        assert passed["code"] == e.code
        assert passed["k_margin"] == e.k_margin and passed["uses_k"] == int(e.uses_k), e.name
        assert passed["natural_mean"] == int(e.scale == "mean"), e.name
    exact = estimators.get("maxk_offpolicy_exact")
    with pytest.raises(ValueError, match="maxk_offpolicy_exact"):
        launcher.launch_arguments(values, offsets, values, values, 2, exact.code, None, 0.0, 1.0,
                                  True, 2, 1e-6, 8)


def test_device_guard_selects_the_tensors_device():
    """A CUDA tensor's launch runs under torch.cuda.device(its device): Triton then launches on that
    device and that device's current stream. (Entering it needs a GPU; on CPU the guard is a no-op.)"""
    from types import SimpleNamespace

    fake = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    guard = _config.device_guard(fake)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    with _config.device_guard(torch.zeros(2)):
        pass


@pytest.mark.parametrize("size,block", [(0, 8), (1, 8), (8, 8), (9, 16), (32, 32), (33, 64),
                                        (1000, 1024), (4096, 4096)])
def test_group_sizes_bucket_to_powers_of_two(size, block):
    assert _config.block_for(size) == block


def test_groups_beyond_the_largest_block_are_refused():
    with pytest.raises(ValueError, match=f"at most {_config.MAX_BLOCK}"):
        _config.block_for(_config.MAX_BLOCK + 1)


def test_launch_configs():
    blocks = _config.all_blocks()
    assert blocks[0] == _config.MIN_BLOCK and blocks[-1] == _config.MAX_BLOCK
    for block in blocks:
        config = _config.config_for_block(block)
        assert config.block == block and 2 ** config.log2_block == block
        assert config.groups >= 1 and config.groups & (config.groups - 1) == 0
        assert config.lanes == (block <= _config.LANE_MAX_BLOCK)
        # only the thread-per-group kernels leave the off-policy branch out
        assert config.deltas and _config.config_for_block(block, False).deltas == (not config.lanes)
        if config.lanes:  # every thread of the program holds a group of its own
            assert config.groups == 32 * config.num_warps
        else:
            assert config.num_warps in (4, 8, 16, 32)
        # a batch of few groups is spread over threads at every block
        few = _config.config_for(block, True, _config.LANE_MIN_GROUPS - 1)
        assert not few.lanes and few == _config.config_for_block(block, True, False)
        assert _config.config_for(block, True, _config.LANE_MIN_GROUPS) == config
    with _config.lane_threshold(1):
        assert _config.config_for(8, True, 1).lanes
    assert not _config.config_for(8, True, 1).lanes


def test_specialisations_cover_every_dtype_and_block():
    from bonkernels.triton.aot import specialisations

    specs = specialisations()
    assert len(specs) == len(_config.VALUE_DTYPES) * len(_config.all_configs())
    lane_blocks = {c.block for c in _config.all_configs() if c.lanes}
    # three per lane block: lanes with and without the off-policy branch, and spread
    assert len(_config.all_configs()) == len(_config.all_blocks()) + 2 * len(lane_blocks)
    assert {s.dtype_name for s in specs} == {"fp16", "bf16", "fp32", "fp64"}


def test_float_arguments_travel_as_exact_bits():
    import struct

    from bonkernels.triton.advantages import float64_bits

    for x in (0.2, -1e-300, 1e-6, math.inf, -math.inf, 0.0, -0.0):
        assert struct.pack("<q", float64_bits(x)) == struct.pack("<d", x)  # -0.0 too


def test_launches_use_exactly_the_compiled_specialisations():
    """Triton's own argument binder (as its launcher runs it, here for an sm_90 target) sees the
    types and constexprs that aot.py compiles, whatever k, the group count or the pointer alignment:
    so the compile check covers every kernel a launch can need."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as error:  # a private API of triton 3.x
        pytest.skip(f"triton internals moved: {error}")
    from bonkernels.triton._sources import signature as _signature
    from bonkernels.triton.advantages import advantages_kernel, launch_arguments

    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(advantages_kernel.signature, advantages_kernel.params,
                                            backend)
    for dtype, name in _config.TRITON_DTYPE_NAMES.items():
        storage = torch.rand(70, dtype=torch.float64).to(dtype)
        cases = [(storage, 1, [16, 17], None), (storage[1:], 16, [69], None),
                 (storage[3:20], 7, [1] * 17, 0.2), (storage[:64], 2**31 - 1, [64], None)]
        for values, k, sizes, clamp in cases:
            offsets = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)))
            deltas = values * 0 if clamp is not None else None
            code = 4 if clamp is not None else 3
            block = _config.block_for(max(sizes))
            grid, args, kwargs = launch_arguments(values, offsets, deltas, torch.empty_like(values),
                                                  k, code, clamp, -math.inf, 1.5, True, 2, 1e-4,
                                                  block)
            bound, specialization, options = binder(*args, **kwargs)
            _, signature, constexprs, attrs = advantages_kernel._pack_args(
                backend, kwargs, bound, specialization, options)
            assert signature == _signature(name), (name, k, sizes)
            if clamp is None:  # a mixture's bank: the same kernel
                bank = torch.zeros(50, dtype=torch.float64)[3:]
                bank_index = torch.zeros(2 * max(sizes) + 2, dtype=torch.int64)[::2]
                _, bank_args, _ = launch_arguments(values, offsets, None, values, k, 0, None,
                                                   -math.inf, 1.5, True, 2, 1e-4, block,
                                                   bank, bank_index.contiguous())
                bound, specialization, options = binder(*bank_args, **kwargs)
                _, bank_signature, _, bank_attrs = advantages_kernel._pack_args(
                    backend, kwargs, bound, specialization, options)
                assert bank_signature == signature and not any(bank_attrs.values())
            assert all(not a for a in attrs.values()), attrs
            # (SERIAL: off in the kernel with every estimator on a GPU, which aot.py compiles; on
            # for these CPU tensors, the interpreter's launches)
            expected = dict(_config.config_for(block, clamp is not None, len(sizes)).constexprs(),
                            SERIAL=_config.serial_on(values))
            assert constexprs == {(advantages_kernel.arg_names.index(key),): value
                                  for key, value in expected.items()}
    assert not _config.serial_on(types.SimpleNamespace(is_cuda=True))
    # the compiled kernels: SERIAL off with every estimator, on with one
    from bonkernels.triton import _facts, _sources

    serial_at = (advantages_kernel.arg_names.index("SERIAL"),)
    config = _config.config_for_block(16)
    assert _sources.source("fp32", config).constants[serial_at] is False
    own = _sources.constants_of(_facts.get("maxk"), True)
    assert _sources.source("fp32", config, own).constants[serial_at] is True


def test_direct_launch_passes_what_tritons_launch_passes():
    """From a plan's second call, PreparedLaunch calls the compiled kernel's launcher itself. It
    must pass what Triton's own launch passes it: the arguments Triton's binder binds, in order,
    the constexprs last in signature order (the test above shows the compiled kernel is the same
    for every k, group count and alignment, so one kept kernel serves every call)."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as error:  # a private API of triton 3.x
        pytest.skip(f"triton internals moved: {error}")
    from bonkernels.triton.advantages import PreparedLaunch, advantages_kernel, estimator_for_launch

    binder = create_function_from_signature(advantages_kernel.signature, advantages_kernel.params,
                                            make_backend(GPUTarget("cuda", 90, 32)))
    values = torch.rand(40)
    offsets = torch.tensor([0, 16, 30, 40])
    bank = torch.zeros(30, dtype=torch.float64)
    bank_index = torch.zeros(17, dtype=torch.int64)
    cases = (("maxk_loo1", 16, False), ("maxk_loo1", 16, True), ("maxk_offpolicy", 8, False),
             ("grpo", 64, False))
    for (name, block, with_bank), lanes_from in itertools.product(cases, (1, _config.LANE_MIN_GROUPS)):
        est = estimators.get(name)
        deltas = values * 0.1 if est.needs_deltas else None
        launch = PreparedLaunch(estimator_for_launch(est.code, deltas, bank if with_bank else None), 3,
                                0.2 if deltas is not None else None, -math.inf, 1.5, True, 2, 1e-4,
                                block, with_bank)
        with _config.lane_threshold(lanes_from):
            config, _, args = launch.arguments(values, offsets, deltas, torch.empty_like(values),
                                               bank if with_bank else None, bank_index if with_bank else None)
        assert config.lanes == (lanes_from == 1 and block <= _config.LANE_MAX_BLOCK)
        bound, _, _ = binder(*args, **launch.kwargs(config))
        direct = args + launch.constexpr_values(config)
        assert list(bound) == advantages_kernel.arg_names and len(direct) == len(bound)
        for arg, (key, want) in zip(direct, bound.items()):
            assert arg is want if isinstance(want, torch.Tensor) else arg == want, (name, key)


def test_gpu_launches_run_their_estimators_kernel():
    """On a GPU every launch, in either layout, takes the kernel compiled for its estimator;
    launches traced by torch.compile, launches with an int64 count of groups, launches on the CPU
    (the interpreter) and launches with the switch off take the kernel with every estimator."""
    from bonkernels.triton.advantages import _compiled_kernel_fits, runs_own_kernel

    assert runs_own_kernel(True, 10) and runs_own_kernel(True, 2**31 - 1)
    assert not runs_own_kernel(True, 10, traced=True)
    assert not runs_own_kernel(True, 2**31) and not runs_own_kernel(False, 10)
    with _config.specialised_kernels(False):
        assert not runs_own_kernel(True, 10)
    assert runs_own_kernel(True, 10)
    assert _compiled_kernel_fits(True, 2**31 - 1) and not _compiled_kernel_fits(True, 2**31)
    assert not _compiled_kernel_fits(False, 10)


def test_own_kernel_lanes_reach_block_32_on_policy_for_narrow_rewards():
    """A launch that runs its estimator's own kernel takes a thread per group up to
    OWN_KERNEL_LANE_MAX_BLOCK, on-policy and for 16- and 32-bit rewards only; the others stop at
    LANE_MAX_BLOCK. `own_kernel_lanes` forces the choice either way (tests, the GPU check)."""
    top = _config.OWN_KERNEL_LANE_MAX_BLOCK
    assert top == 2 * _config.LANE_MAX_BLOCK
    own = _config.config_for_block(top, False, True, own_kernel=True)
    assert own.lanes and not own.deltas and own.groups == 32
    assert not _config.config_for_block(top, False, True).lanes  # the kernel with every estimator
    assert not _config.config_for_block(top, True, True, own_kernel=True).lanes  # off-policy
    assert not _config.config_for_block(top, False, False, own_kernel=True).lanes  # a small batch
    assert not _config.config_for_block(2 * top, False, True, own_kernel=True).lanes
    # a centred estimator's own kernel goes one block further (no sort, no tables)
    widest = _config.CENTRED_LANE_MAX_BLOCK
    assert widest == 2 * top
    assert _config.config_for_block(widest, False, True, own_kernel=True, centred=True).lanes
    assert not _config.config_for_block(widest, False, True, centred=True).lanes
    assert not _config.config_for_block(2 * widest, False, True, own_kernel=True, centred=True).lanes
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert _config.takes_own_kernel_lanes(True, dtype) and not _config.takes_own_kernel_lanes(False, dtype)
    assert not _config.takes_own_kernel_lanes(True, torch.float64)
    with _config.own_kernel_lanes(True):
        assert _config.takes_own_kernel_lanes(False, torch.float64)
    with _config.own_kernel_lanes(False):
        assert not _config.takes_own_kernel_lanes(True, torch.float32)
    assert _config.OWN_KERNEL_LANES is None


def test_serial_estimators_keep_lanes_to_their_blocks_from_a_bank():
    """From a bank, the registry's one_pass estimators go through a group a column at a time where
    a thread holds it (the kernel's _serial_from_bank names the same set, and only from a bank),
    so their own kernels keep a thread per group up to that block, off-policy included; without
    a bank, or without their own kernel, the blocks of the others."""
    from bonkernels.triton import _advantages_kernel as kernel
    from bonkernels.triton import _facts

    for est in _facts.kernel_estimators():
        code = tl.constexpr(est.code)
        assert bool(kernel._serial_from_bank.fn(code, tl.constexpr(1))) == est.one_pass
        assert not kernel._serial_from_bank.fn(code, tl.constexpr(0))
        assert _config.serial_lanes_up_to(est, False) == 0
        assert (_config.serial_lanes_up_to(est, True) > 0) == est.one_pass
    assert set(_config.SERIAL_SPILL_ABOVE_32) <= {e.name for e in _facts.kernel_estimators() if e.one_pass}
    for est in [e for e in _facts.kernel_estimators() if e.one_pass]:
        top = _config.serial_lanes_up_to(est, True)
        assert top == (32 if est.name in _config.SERIAL_SPILL_ABOVE_32 else _config.SERIAL_LANE_MAX_BLOCK)
        assert _facts.linear_in_tables(est) and top > _config.LANE_MAX_BLOCK
        assert _config.estimator_lanes_up_to(est, has_bank=True) == top >= _config.estimator_lanes_up_to(est)
        assert _config.estimator_lanes_up_to(est, own_kernel=False, has_bank=True) == _config.LANE_MAX_BLOCK
        config = _config.config_for_block(top, est.needs_deltas, True, own_kernel=True, serial_block=top)
        assert config.lanes and config.deltas == est.needs_deltas
        assert not _config.config_for_block(2 * top, est.needs_deltas, True, own_kernel=True, serial_block=top).lanes
        assert not _config.config_for_block(top, est.needs_deltas, True, serial_block=top).lanes
        assert not _config.config_for_block(top, est.needs_deltas, False, own_kernel=True, serial_block=top).lanes
    assert _config.estimator_lanes_up_to(estimators.get("maxk_offpolicy")) == _config.LANE_MAX_BLOCK


def test_only_launches_that_run_their_own_kernel_take_lanes_at_block_32(monkeypatch):
    """PreparedLaunch picks the block-32 lanes only where its launch will run the estimator's own
    kernel: on a GPU (emulated: CPU tensors here), not traced by torch.compile (whose launch runs
    the kernel with every estimator), with the switch on, and on 16- or 32-bit rewards."""
    from bonkernels.triton import advantages as launcher

    offsets = torch.tensor([0, 32, 64])
    launch = launcher.PreparedLaunch(launcher.estimator_for_launch(estimators.get("grpo").code, None, None),
                                     1, None, -math.inf, math.inf, True, 2, 1e-4, 32, False)

    def lanes(values, traced=False):
        config, _, _ = launch.arguments(values, offsets, None, torch.empty_like(values), None, None, traced)
        assert config.block == 32
        return config.lanes

    with _config.lane_threshold(1):
        assert not lanes(torch.rand(64))  # CPU tensors run no kernel of their own
        monkeypatch.setattr(launcher, "_compiled_kernel_fits", lambda on_gpu, num_groups: True)
        assert lanes(torch.rand(64)) and lanes(torch.rand(64).bfloat16())
        assert not lanes(torch.rand(64), traced=True)
        assert not lanes(torch.rand(64, dtype=torch.float64))
        with _config.specialised_kernels(False):
            assert not lanes(torch.rand(64))
        with _config.own_kernel_lanes(False):
            assert not lanes(torch.rand(64))


def test_specialised_kernels_take_the_launch_arguments():
    """The estimator's kernel is launched with the generic kernel's arguments (its launcher skips
    constexprs): the compiled constants sit at the kernel's estimator arguments, and equal what the
    call passes there, for every estimator and bank mode, in both layouts."""
    from bonkernels.triton import _facts, _sources, aot
    from bonkernels.triton.advantages import PreparedLaunch, advantages_kernel, estimator_for_launch

    values = torch.rand(40)
    offsets = torch.tensor([0, 16, 30, 40])
    bank, bank_index = torch.zeros(30, dtype=torch.float64), torch.zeros(17, dtype=torch.int64)
    lane_specs, spread_specs = aot.estimator_specialisations(), aot.estimator_specialisations(lanes=False)
    for specs in (lane_specs, spread_specs):
        assert {s.constants.code for s in specs} == {e.code for e in _facts.kernel_estimators()}
    assert {s.config.block for s in spread_specs} == set(_config.all_blocks())
    for spec in lane_specs + spread_specs:
        est = estimators.BY_CODE[spec.constants.code]
        with_bank = bool(spec.constants.has_bank)
        deltas = values * 0.1 if est.needs_deltas else None
        launch = PreparedLaunch(estimator_for_launch(est.code, deltas, bank if with_bank else None), 3, None,
                                -math.inf, 1.5, True, 2, 1e-4, spec.config.block, with_bank)
        assert launch.constants == spec.constants
        # (on a GPU a launch that runs its own kernel takes lanes up to OWN_KERNEL_LANE_MAX_BLOCK;
        # a batch below the threshold spreads its groups)
        with _config.lane_threshold(1 if spec.config.lanes else 2**40), _config.own_kernel_lanes(True):
            config, _, args = launch.arguments(values, offsets, deltas, torch.empty_like(values),
                                               bank if with_bank else None, bank_index if with_bank else None)
        assert config == spec.config
        signature = _sources.signature("fp32", launch.constants)
        assert list(signature) == advantages_kernel.arg_names
        assert len(args) + len(launch.constexpr_values(config)) == len(signature)
        for name in _sources.ESTIMATOR_ARGUMENTS:
            at = advantages_kernel.arg_names.index(name)
            assert signature[name] == "constexpr" and args[at] == getattr(launch.constants, name), (est.name, name)


SPECIALISED_PROBE = """
from bonkernels.triton import _config, aot
generic = {}  # each lane configuration's kernel with every estimator, compiled once
for spec in aot.estimator_specialisations():
    if spec.config.block > _config.OWN_KERNEL_LANE_MAX_BLOCK:  # centred only: not compared
        generic[spec.config] = "-"
    if spec.config not in generic:
        kernel = aot.compile_one(aot.Specialisation(spec.dtype_name, spec.config), 90)
        generic[spec.config] = aot.resource_usage(kernel.asm["ptx"], 90)
    print(spec.describe(), "|", aot.resource_usage(aot.compile_one(spec, 90).asm["ptx"], 90), "|",
          generic[spec.config])
"""


# Spill loads allowed per sample in an estimator's lane kernel above LANE_MAX_BLOCK: about what
# the off-policy lane kernel at 16 loads (264 bytes a thread, 136 stored), which the second H200
# session measured 2.9x faster than the spread layout (255 against 744 us, N = 2^24, n = 16).
OWN_KERNEL_SPILL_PER_SAMPLE = 16


def test_specialised_lane_kernels_compile_with_fewer_registers():
    """Every estimator's lane kernel (fp32, every lane block, each bank mode) compiles for sm_90
    without a spill and with fewer registers than the kernel with every estimator, or, where both
    take all 255 (off-policy at 16), where that one spills: the point of compiling one per
    estimator (a thread holds its whole group). Above LANE_MAX_BLOCK, where only the on-policy
    estimators' kernels run lanes, a thread holds 32 float64s per tile and
    may spill: less than the kernel with every estimator, and within OWN_KERNEL_SPILL_PER_SAMPLE.
    Above OWN_KERNEL_LANE_MAX_BLOCK only the centred estimators and maxk, passk and maxk_loo1
    from a bank run lanes, and without a spill. The kernels that go through a group a column at a time
    (the registry's one_pass estimators, from a bank) never spill, maxk_offpolicy at 32 included."""
    import re

    from bonkernels.triton import _facts, aot

    result = _run(["-c", SPECIALISED_PROBE], {}, 900)
    assert result.returncode == 0, _tail(result)
    lines = result.stdout.splitlines()
    specs = aot.estimator_specialisations()
    assert len(lines) == len(specs) > 0, result.stdout
    assert {s.config.block for s in specs} == {b for b in _config.all_blocks()
                                               if b <= _config.CENTRED_LANE_MAX_BLOCK}
    widest = [s for s in specs if s.config.block > _config.OWN_KERNEL_LANE_MAX_BLOCK]
    assert {estimators.BY_CODE[s.constants.code].name for s in widest} == {
        e.name for e in _facts.kernel_estimators() if e.centred} | {
        e.name for e in _facts.kernel_estimators() if _config.serial_lanes_up_to(e, True) > _config.OWN_KERNEL_LANE_MAX_BLOCK}
    serial = [s for s in specs if s.constants.has_bank
              and estimators.BY_CODE[s.constants.code].one_pass]
    assert max(s.config.block for s in serial if s.config.deltas) == 32  # maxk_offpolicy
    for spec, line in zip(specs, lines):
        if spec in widest or spec in serial:  # (the columns at a time: no spill at any block)
            usage = re.search(r"(\d+) registers, spills (\d+)/(\d+) bytes", line.split("|")[1])
            assert usage and usage.group(2) == usage.group(3) == "0", line
            continue
        usage = [re.search(r"(\d+) registers, spills (\d+)/(\d+) bytes", part) for part in line.split("|")[1:]]
        assert len(usage) == 2 and all(usage), line
        (registers, stored, loaded), (generic_registers, generic_stored, _) = [
            tuple(int(g) for g in m.groups()) for m in usage]
        if spec.config.block <= _config.LANE_MAX_BLOCK:
            assert stored == 0 and (registers < generic_registers or generic_stored > 0), line
        else:
            assert stored < generic_stored and registers <= generic_registers, line
            assert loaded <= OWN_KERNEL_SPILL_PER_SAMPLE * spec.config.block, line


SPREAD_PROBE = """
from bonkernels.triton import _config, _facts, aot
picked = {("maxk_loo1", 1), ("maxk_offpolicy", 1), ("maxk_loo", 0), ("grpo", 0)}
for block in (32, 1024):
    generic = aot.compile_one(aot.Specialisation("fp32", _config.config_for_block(block, True, False)), 90)
    for spec in aot.estimator_specialisations(lanes=False):
        name = _facts.by_code(spec.constants.code).name
        if spec.config.block == block and (name, spec.constants.has_bank) in picked:
            print(spec.describe(), "|", aot.resource_usage(aot.compile_one(spec, 90).asm["ptx"], 90), "|",
                  aot.resource_usage(generic.asm["ptx"], 90))
"""


def test_spread_kernels_per_estimator_fit_without_a_spill():
    """A small batch spreads each group over threads; on a GPU its launch runs the kernel compiled
    for its estimator too. Sampled at blocks 32 and 1024 (sm_90, float32), for estimators with
    rank tables, deltas, leave-one-out tables and none: no spill, and no more registers than the
    kernel with every estimator (which takes 128 and spills at 1024)."""
    import re

    result = _run(["-c", SPREAD_PROBE], {}, 900)
    assert result.returncode == 0, _tail(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 8, result.stdout
    for line in lines:
        usage = [re.search(r"(\d+) registers, spills (\d+)/(\d+) bytes", part) for part in line.split("|")[1:]]
        assert len(usage) == 2 and all(usage), line
        (registers, stored, loaded), (generic_registers, _, _) = [tuple(int(g) for g in m.groups()) for m in usage]
        assert stored == loaded == 0 and registers <= generic_registers, line


BIG_BLOCK_PROBE = """
from bonkernels.triton import _facts, aot
picked = {(2048, "maxk", 1), (2048, "maxk_loo", 0), (2048, "maxk_offpolicy", 1), (2048, "bon_mean", 0),
          (4096, "maxk_offpolicy", 0), (4096, "maxk_offpolicy", 1)}
for spec in aot.estimator_specialisations(lanes=False):
    name = _facts.by_code(spec.constants.code).name
    if (spec.config.block, name, spec.constants.has_bank) in picked:
        print(spec.config.block, name, spec.constants.has_bank, spec.config.num_warps, "|",
              aot.resource_usage(aot.compile_one(spec, 90).asm["ptx"], 90))
"""
# Spill loads a thread of maxk_offpolicy's own spread kernel at BLOCK = 4096 (sm_90, float32, 64
# registers a thread), by bank mode: measured 32 from a bank and 208 without, where the tables
# alive across the scans (the order of the code before) spilled 364 and 296.
OFF_POLICY_4096_SPILL_LOADS = {1: 64, 0: 256}


def test_big_spread_blocks_keep_their_registers():
    """The largest spread blocks, where a program's threads share an SM's registers (sm_90,
    float32): at BLOCK = 2048, 16 warps (128 registers a thread) take the own kernels that spilled
    with 32 (64 registers a thread) without a spill, sampled; at 4096 (32 warps) maxk_offpolicy,
    whose terms are formed before its scans (_off_policy_weights), spills within
    OFF_POLICY_4096_SPILL_LOADS, a fraction of what it spilled with its tables alive across them."""
    import re

    result = _run(["-c", BIG_BLOCK_PROBE], {}, 600)
    assert result.returncode == 0, _tail(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 6, result.stdout
    for line in lines:
        block, name, has_bank, warps = line.split("|")[0].split()
        usage = re.search(r"(\d+) registers, spills (\d+)/(\d+) bytes", line)
        assert usage, line
        loaded = int(usage.group(3))
        if block == "2048":
            assert warps == "16" and loaded == 0, line
        else:
            assert loaded <= OFF_POLICY_4096_SPILL_LOADS[int(has_bank)], line


def test_only_a_loaded_kernel_of_the_launch_shape_is_kept():
    """PreparedLaunch keeps a kernel for direct launches only when it is loaded (a function handle:
    a real launch on a GPU) and takes one parameter per argument it will be passed."""
    from bonkernels.triton import _sources, aot
    from bonkernels.triton.advantages import _directly_launchable

    config = _config.config_for_block(8, False, True)
    compiled = aot.compile_one(aot.Specialisation("fp32", config), 90)  # compiled, never loaded
    count = len(compiled.src.signature)
    assert count == len(_sources.signature("fp32"))
    assert not _directly_launchable(compiled, count)
    assert not _directly_launchable(None, count)


def test_direct_launch_leaves_launch_hooks_to_triton():
    """With no launch hook set a plan launches directly; a profiler's hook (Triton's knobs, chains
    that are never None in Triton 3.6) sends every launch back through Triton, which calls it."""
    import triton

    from bonkernels.triton.advantages import _launch_hooks_set

    assert not _launch_hooks_set()
    runtime = triton.knobs.runtime
    hook = lambda metadata: None  # noqa: E731
    for chain in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        chain.add(hook)
        try:
            assert _launch_hooks_set()
        finally:
            chain.remove(hook)
    assert not _launch_hooks_set()


def test_kernel_constants_are_never_copied():
    """Triton compares every global constant of a kernel with a deep copy at each launch; the
    kernel's constants copy to themselves, so that comparison is an identity check."""
    import copy

    from bonkernels.triton import _advantages_kernel as kernel

    constants = {name: value for name, value in vars(kernel).items() if isinstance(value, tl.constexpr)}
    assert len(constants) >= 20
    for name, value in constants.items():
        assert isinstance(value, kernel._Constant), name
        assert copy.deepcopy(value) is value and not (value != value), name
    assert kernel.MAXK != kernel._Constant(kernel.MAXK.value + 1)
    assert not (kernel.MAXK != kernel._Constant(kernel.MAXK.value))


# ---------------------------------------------------------------- device rules, registration

def test_package_import_does_not_import_triton():
    result = _run(["-c", "import sys, bonkernels, bonkernels.triton as t; "
                         "assert t.available(); assert 'triton' not in sys.modules, 'imported'"],
                  {}, 120)
    assert result.returncode == 0, _tail(result)


@pytest.mark.skipif(INTERPRETING, reason="the interpreter runs CPU tensors")
def test_cpu_tensors_need_cuda_or_the_interpreter():
    import bonkernels as bk
    from bonkernels import triton as bk_triton

    values = torch.rand(6, dtype=torch.float32)
    offsets = torch.tensor([0, 2, 6])
    with pytest.raises(ValueError, match="CUDA tensors.*TRITON_INTERPRET=1"):
        bk_triton.advantages_packed(values, offsets, None, 2, 0, None, -math.inf, math.inf, True,
                                    0, 1e-6, None)
    with pytest.raises(ValueError, match="CUDA"):
        bk.advantages(values.view(2, 3), 2, "maxk", backend="triton")


def test_op_is_registered_and_traceable():
    """torch.export traces through the op (its fake implementation) without running a kernel."""
    from bonkernels.triton import advantages  # noqa: F401  (registers the op)

    class UsesOp(torch.nn.Module):
        def forward(self, values, offsets):
            out = torch.ops.bonkernels.triton_advantages(values, offsets, None, 2, 3, None,
                                                         -math.inf, math.inf, True, 0, 1e-6, 16)
            return out * 2

    values = torch.rand(10, dtype=torch.float32)
    offsets = torch.tensor([0, 4, 10])
    exported = torch.export.export(UsesOp(), (values, offsets))
    code = exported.graph_module.code
    assert "bonkernels.triton_advantages" in code
    outputs = [n for n in exported.graph.nodes if n.op == "call_function"
               and "triton_advantages" in str(n.target)]
    assert outputs[0].meta["val"].shape == values.shape
    assert outputs[0].meta["val"].dtype == values.dtype


# ---------------------------------------------------------------- the subprocess suites

@pytest.mark.skipif(INTERPRETING, reason="the interpreter suite runs in this process already")
def test_interpreter_suite():
    """The python_tests/test_triton_interpreter*.py suites under TRITON_INTERPRET=1 (a few minutes)."""
    result = _run(["-m", "pytest", *INTERPRETER_SUITES, "-q",
                   "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning"],
                  {"TRITON_INTERPRET": "1"}, 1200)
    assert result.returncode == 0, _tail(result)
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], \
        _tail(result)


def _compile(args, expected):
    jobs = max(1, min(4, os.cpu_count() or 1))
    result = _run(["-m", "bonkernels.triton.aot", *args, "--jobs", str(jobs)], {}, 3600)
    assert result.returncode == 0, _tail(result)
    assert f"{expected} compiled, 0 failed" in result.stdout, _tail(result)


def test_both_sort_paths_compile_for_sm90():
    """A quick subset of the check below (about 30 s): every dtype, one block per layout."""
    configs = [c for c in _config.all_configs() if c.block in (16, 64)]  # 16: lanes (two) and spread
    _compile(["--arch", "90", "--block", "16", "64"], len(_config.VALUE_DTYPES) * len(configs))


LANE_LAYOUT_PROBE = """
from bonkernels.triton import _config, aot
for dtype in ("fp32", "fp64", "bf16"):
    for config in _config.all_configs():
        if not config.lanes:
            continue
        compiled = aot.compile_one(aot.Specialisation(dtype, config), 90)
        ptx = compiled.asm["ptx"]
        print(dtype, config.block, ptx.count("shfl.sync"), ptx.count("bar.sync"),
              compiled.metadata.shared)
"""


def test_thread_per_group_blocks_compile_without_cross_thread_traffic():
    """In the lane layout a thread holds its whole group: the compiled kernel exchanges nothing
    between threads (no barrier, no shared memory) but the one warp-wide maximum of the program's
    oversized groups (ten shuffles: 64 bits over 5 steps). A load or scan that Triton lays out
    across threads brings back hundreds of shuffles (a reverse tl.cumsum alone did)."""
    result = _run(["-c", LANE_LAYOUT_PROBE], {}, 600)
    assert result.returncode == 0, _tail(result)
    rows = [line.split() for line in result.stdout.splitlines()]
    lane_configs = [c for c in _config.all_configs() if c.lanes]
    assert len(rows) == 3 * len(lane_configs) and lane_configs
    for dtype, block, shuffles, barriers, shared in rows:
        assert int(shuffles) <= 10 and int(barriers) == 0 and int(shared) == 0, \
            (dtype, block, shuffles, barriers, shared)


@pytest.mark.skipif(INTERPRETING, reason="compiles for a GPU target: TRITON_INTERPRET must be unset")
def test_lane_sort_compares_each_pair_once():
    """The thread-per-group sort's exchanges, compiled for sm_90 in the lane layout: one float32
    compare per exchange of Batcher's odd-even merge network (enumerated here on its own; tl.sort
    has each end of a pair compare on its own, twice as many, and a bitonic network has more
    pairs) and nothing exchanged between threads. The interpreter suite checks what it sorts
    (test_lane_sort_sorts_and_moves_the_columns_alike, test_lane_sort_sorts_every_row_of_zeros_and_ones)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bonkernels.triton import _advantages_kernel as kernel

    @triton.jit
    def probe(keys_ptr, out_ptr, BLOCK: tl.constexpr, LOG2_BLOCK: tl.constexpr):
        at = tl.arange(0, 32)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
        cols = tl.zeros([32, BLOCK], dtype=tl.int32) + tl.arange(0, BLOCK)[None, :]
        keys, items = kernel._lane_sort(kernel._load(keys_ptr + at, at >= 0, 0.0, True), cols, LOG2_BLOCK)
        kernel._store(out_ptr + at, keys + items.to(tl.float32), at >= 0, True)

    for log2_block in (3, 4, 5, 6):
        block = 1 << log2_block
        signature = {"keys_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "constexpr", "LOG2_BLOCK": "constexpr"}
        source = ASTSource(fn=probe, signature=signature, constexprs={"BLOCK": block, "LOG2_BLOCK": log2_block})
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
        exchanges = len(_odd_even_merge_pairs(block))  # 19, 63, 191, 543
        compares = len(re.findall(r"setp\.\w+\.f32", ptx))
        assert exchanges <= compares <= exchanges * 1.05 + 1, (block, compares, exchanges)
        assert "shfl.sync" not in ptx and "bar.sync" not in ptx, block


def _odd_even_merge_pairs(n):
    """The compare-exchanges of Batcher's odd-even merge sort of n (a power of two) columns."""
    pairs, merge = [], 1
    while merge < n:
        distance = merge
        while distance >= 1:
            for j in range(distance % merge, n - distance, 2 * distance):
                for i in range(min(distance, n - j - distance)):
                    if (i + j) // (2 * merge) == (i + j + distance) // (2 * merge):
                        pairs.append((i + j, i + j + distance))
            distance //= 2
        merge *= 2
    return pairs


@pytest.mark.slow  # 80 compilations: 5-10 minutes on 2 cores (the largest blocks cost most)
def test_every_specialisation_compiles_for_sm80_and_sm90():
    """triton.compile (no GPU needed) of each (dtype, BLOCK) for sm_80 and sm_90: the interpreter
    accepts programs that the GPU compiler rejects."""
    _compile(["--arch", "80", "90"], len(_config.VALUE_DTYPES) * len(_config.all_configs()) * 2)


# ---------------------------------------------------------------- NaN through the compiled clip

@pytest.mark.skipif(INTERPRETING, reason="compiles for a GPU target: TRITON_INTERPRET must be unset")
def test_compiled_clip_keeps_nan():
    """Compiled tl.maximum/tl.minimum become max.f64/min.f64, which return the other operand for a
    NaN (the interpreter propagates it, so only the compiled code shows this): the kernel's clip
    compares and selects instead (its casting form too), and is what the kernel applies to its
    result."""
    import inspect

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bonkernels.triton import _advantages_kernel as kernel

    @triton.jit
    def clip_probe(x_ptr, out_ptr, lo, hi):
        cols = tl.arange(0, 16)
        tl.store(out_ptr + cols, kernel._clip_keeping_nan(tl.load(x_ptr + cols), lo, hi))

    @triton.jit
    def clip_cast_probe(x_ptr, out_ptr, lo, hi):
        cols = tl.arange(0, 16)
        tl.store(out_ptr + cols, kernel._clip_cast(tl.load(x_ptr + cols), lo, hi, out_ptr.dtype.element_ty))

    for probe, out_type in ((clip_probe, "*fp64"), (clip_cast_probe, "*fp64"), (clip_cast_probe, "*fp32")):
        signature = {"x_ptr": "*fp64", "out_ptr": out_type, "lo": "fp64", "hi": "fp64"}
        compiled = triton.compile(ASTSource(fn=probe, signature=signature),
                                  target=GPUTarget("cuda", 90, 32))
        assert "arith.maxnumf" not in compiled.asm["ttir"] and "arith.minnumf" not in compiled.asm["ttir"]
        ptx = compiled.asm["ptx"]
        assert "max.f" not in ptx and "min.f" not in ptx and "selp." in ptx, (probe, out_type)
    # the kernel's tail (_finish, in both forms) clips with it
    finish = inspect.getsource(kernel._finish.fn)
    assert "_clip_cast(result, clip_lo, clip_hi, out_dtype)" in finish
    for fn in (kernel.advantages_kernel, kernel._serial_outputs):
        source = inspect.getsource(fn.fn)
        assert "_finish(result, " in source and "_clip_cast" not in source, fn
    assert all("tl.minimum(tl.maximum(result" not in inspect.getsource(fn.fn)
               for fn in (kernel.advantages_kernel, kernel._serial_outputs, kernel._finish))
