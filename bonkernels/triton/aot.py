"""Ahead-of-time compilation of every kernel specialisation the op can launch (no GPU needed).

The interpreter accepts programs that the compiler rejects (and runs none of the GPU lowering), so
CI compiles each specialisation for real GPU targets:

    python -m bonkernels.triton.aot --arch 80 90        # TRITON_INTERPRET must be unset

A specialisation is (values dtype, BLOCK, and for the thread-per-group blocks whether the
off-policy branch is in): the estimator, k and every option are runtime arguments, and BLOCK fixes
the groups per program and the layout (see _config.py). A launch on a GPU compiles its kernel with
the estimator's facts as constants (_sources.py): one per estimator, bank mode, dtype, block and
layout, too many to compile them all in CI, so `--estimators` compiles every estimator's in each
bank mode, at one dtype (fp32 unless --dtype says otherwise), every block and both layouts (it
also fills Triton's cache for the launches of a GPU session).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

from . import _config, _facts, _sources


@dataclass(frozen=True)
class Specialisation:
    dtype_name: str  # triton name of the values/deltas/output dtype: fp16, bf16, fp32, fp64
    config: _config.LaunchConfig
    constants: Optional[_sources.EstimatorConstants] = None  # the estimator compiled in, if any

    def describe(self) -> str:
        c = self.config
        layout = "a thread per group" if c.lanes else "a group across threads"
        layout += "" if c.deltas else ", on-policy"
        if self.constants is not None:
            est = _facts.by_code(self.constants.code)
            layout += f", {est.name}{' from a bank' if self.constants.has_bank else ''}"
        return (f"{self.dtype_name} BLOCK={c.block} GROUPS={c.groups} ({layout}) "
                f"num_warps={c.num_warps}")


def specialisations() -> list[Specialisation]:
    """Every (dtype, launch configuration) the launcher can choose."""
    return [Specialisation(_config.TRITON_DTYPE_NAMES[dtype], config)
            for dtype in _config.VALUE_DTYPES for config in _config.all_configs()]


def estimator_specialisations(dtype_name: str = "fp32", lanes: bool = True) -> list[Specialisation]:
    """The kernel of every estimator, in each bank mode it can be launched with, at one dtype and
    every block: with `lanes`, the launches of a batch that fills the GPU (a thread per group up
    to the estimator's lane block at that dtype, _config.lanes_up_to); without, those of a small
    batch (a group spread over threads at every block)."""
    dtype = next(d for d, name in _config.TRITON_DTYPE_NAMES.items() if name == dtype_name)
    own_kernel_lanes = _config.takes_own_kernel_lanes(True, dtype)  # (not float64's)
    specs = []
    for block in _config.all_blocks():
        for est in _facts.kernel_estimators():
            for has_bank in (False, True) if _facts.linear_in_tables(est) else (False,):
                config = _config.config_for_block(block, est.needs_deltas, lanes, own_kernel=own_kernel_lanes,
                                                  centred=est.centred,
                                                  serial_block=_config.serial_lanes_up_to(est, has_bank))
                if config.lanes != lanes:
                    continue  # above the lane blocks: the spread kernels of the small batches
                specs.append(Specialisation(dtype_name, config, _sources.constants_of(est, has_bank)))
    return specs


def compile_one(spec: Specialisation, arch: int):
    """Compile one specialisation for sm_<arch>; returns the compiled kernel (PTX and cubin)."""
    from triton.backends.compiler import GPUTarget

    return _sources.compile_for(spec.dtype_name, spec.config, GPUTarget("cuda", arch, 32),
                                spec.constants)


def resource_usage(ptx: str, arch: int) -> str:
    """Registers and spills of a kernel, from `ptxas -v` on its PTX (the ptxas bundled with
    triton; no GPU needed). Empty when ptxas is not found."""
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        run = subprocess.run([ptxas, f"-arch={gpu}", "-v", path, "-o", os.devnull],
                             capture_output=True, text=True)
    text = run.stdout + run.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not regs or not spills:
        return ""
    return f", {regs.group(1)} registers, spills {spills.group(1)}/{spills.group(2)} bytes"


def _compile_job(job) -> tuple[bool, str]:
    """Compile one (specialisation, arch); returns (ok, message). Runs in a worker process."""
    spec, arch = job
    start = time.perf_counter()
    try:
        compiled = compile_one(spec, arch)
        if not compiled.asm.get("cubin"):
            raise RuntimeError("no cubin produced")
        return True, (f"sm_{arch} {spec.describe()} ({time.perf_counter() - start:.1f} s, "
                      f"{len(compiled.asm['cubin'])} bytes of cubin"
                      f"{resource_usage(compiled.asm['ptx'], arch)})")
    except Exception as error:  # report every failing specialisation, not just the first
        return False, f"sm_{arch} {spec.describe()}: {type(error).__name__}: {error}"


def compile_all(archs=(80, 90), specs=None, jobs=1, log=print) -> list[str]:
    """Compile every specialisation for every arch (in `jobs` processes); returns the failures."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("ahead-of-time compilation needs TRITON_INTERPRET unset")
    work = [(spec, arch) for spec in (specs if specs is not None else specialisations())
            for arch in archs]
    # the most expensive (largest blocks) first, so parallel workers finish together
    work.sort(key=lambda job: -job[0].config.block)
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            results = pool.imap_unordered(_compile_job, work)
            return _report(results, log)
    return _report(map(_compile_job, work), log)


def _report(results, log) -> list[str]:
    failures = []
    for ok, message in results:
        if ok:
            log(f"ok   {message}")
        else:
            # the first failure in full, the others by their last line (errors tend to repeat)
            log(f"FAIL {message if not failures else message.strip().splitlines()[-1]}")
            failures.append(message)
    return failures


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    parser.add_argument("--dtype", nargs="*", help="only these dtypes (fp16 bf16 fp32 fp64)")
    parser.add_argument("--block", type=int, nargs="*", help="only these blocks")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many processes")
    parser.add_argument("--estimators", action="store_true",
                        help="the kernels compiled per estimator (both layouts; fp32 unless --dtype) instead")
    parser.add_argument("--only", nargs="*", metavar="ESTIMATOR",
                        help="with --estimators: only these estimators' kernels")
    return parser.parse_args(argv)


def selected(args: argparse.Namespace) -> list[Specialisation]:
    """The specialisations a command line asks for."""
    if args.estimators:
        specs = [spec for dtype in (args.dtype or ["fp32"]) for lanes in (True, False)
                 for spec in estimator_specialisations(dtype, lanes)]
        if args.only:
            unknown = set(args.only) - {est.name for est in _facts.kernel_estimators()}
            if unknown:
                raise SystemExit(f"--only: not estimators of the Triton kernel: {sorted(unknown)}")
            specs = [s for s in specs if _facts.by_code(s.constants.code).name in args.only]
    else:
        specs = specialisations()
    return [s for s in specs
            if (not args.dtype or s.dtype_name in args.dtype)
            and (not args.block or s.config.block in args.block)]


def main(argv=None) -> int:
    args = parse_args(argv)
    specs = selected(args)
    start = time.perf_counter()
    failures = compile_all(tuple(args.arch), specs, jobs=args.jobs)
    print(f"{len(specs) * len(args.arch) - len(failures)} compiled, {len(failures)} failed, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
