"""One-shot GPU check of the native CUDA kernels: build, verify against the reference, time.

    python bench/gpu_check.py                  # on the GPU machine: build in place, check, time (< 6 min)
    python bench/gpu_check.py --device cpu     # the same checks and timing code on the CPU backend
    python bench/gpu_check.py --dry-run        # --device cpu with tiny sizes (what CI can run)

Steps (each guarded: a failure is printed and counted, the rest still runs):
1. build: ``setup.py build_ext --inplace`` with the CUDA kernels forced on (BONKERNELS_FORCE_CUDA=1,
   TORCH_CUDA_ARCH_LIST from the device, CUDA_HOME resolved from nvcc), so ``bonkernels._C`` in
   the repository has the CUDA kernels for the later benchmark run;
2. correctness, in a fresh interpreter: every native estimator, n in {1, 2, 3, 8, 16, 31, 32, 33,
   64, 100, 256, 1024, 4096} and ragged batches (empty groups included), float64/float32 (and
   float16/bfloat16 on a subset), with and without the max_group_size hint, outputs poisoned with
   NaN before each run, every call followed by a synchronize so CUDA errors surface where they
   happen; the Triton backend (``bonkernels.triton.advantages_packed``) side by side when importable;
3. timing with CUDA events (warm-up, median of repeats) against a plain copy of the same bytes, and
   a table. The exit status is 0 only when the build and every native check passed.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = (1, 2, 3, 8, 16, 31, 32, 33, 64, 100, 256, 1024, 4096)
RAGGED = (1, 0, 2, 3, 8, 16, 31, 32, 33, 64, 100, 256, 1024, 4096, 7, 0, 5)
START = time.monotonic()


def log(msg: str = "") -> None:
    print(msg, flush=True)


def elapsed() -> float:
    return time.monotonic() - START


# ----------------------------------------------------------------------------- 1. build

def resolve_cuda_home() -> str | None:
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if cand and os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
        try:  # wrapper scripts (e.g. `exec /usr/local/cuda-13.0/bin/nvcc "$@"`)
            text = open(nvcc, errors="replace").read(4096)
            for token in text.split():
                if token.endswith("/bin/nvcc") and os.path.exists(token):
                    return os.path.dirname(os.path.dirname(token))
        except OSError:
            pass
    for cand in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        if os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    return None


def build(timeout_s: float) -> bool:
    import torch
    env = dict(os.environ)
    cuda_home = resolve_cuda_home()
    if cuda_home:
        env["CUDA_HOME"] = cuda_home
        env["PATH"] = os.path.join(cuda_home, "bin") + os.pathsep + env.get("PATH", "")
    if torch.cuda.is_available() and "TORCH_CUDA_ARCH_LIST" not in env:
        major, minor = torch.cuda.get_device_capability()
        env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    if "BONKERNELS_CUDA_ARCHS" not in env and "TORCH_CUDA_ARCH_LIST" in env:  # the bare-nvcc route
        env["BONKERNELS_CUDA_ARCHS"] = env["TORCH_CUDA_ARCH_LIST"].replace(".", "").replace("a", "").split(";")[0]
    env["BONKERNELS_FORCE_CUDA"] = "1"
    env.pop("BONKERNELS_SKIP_CUDA", None)
    env.pop("BONKERNELS_SKIP_EXT", None)
    log(f"[build] CUDA_HOME={cuda_home} TORCH_CUDA_ARCH_LIST={env.get('TORCH_CUDA_ARCH_LIST')} "
        f"torch={torch.__version__} cuda={torch.version.cuda}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log(f"[build] FAILED: timed out after {timeout_s:.0f} s")
        return False
    out = proc.stdout + proc.stderr
    log(f"[build] {'ok' if proc.returncode == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    if proc.returncode != 0:
        log(out[-6000:])
        return False
    for line in out.splitlines():
        if "bonkernels setup:" in line or "spill" in line:
            log("  " + line.strip()[:300])
    return True


# ----------------------------------------------------------------------------- 2. correctness

class Checker:
    def __init__(self, device: str, quick: bool):
        import torch
        from bonkernels import _native, estimators, reference
        self.torch, self.native, self.estimators, self.reference = torch, _native, estimators, reference
        self.device = torch.device(device)
        self.quick = quick
        self.failures: list[str] = []
        self.passed = 0
        self.triton = None
        self.triton_failures: list[str] = []
        self.triton_passed = 0
        self.gen = torch.Generator(device="cpu").manual_seed(2026)
        self.triton_pass = False
        self.incomplete = ""

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def batch(self, sizes, est, dtype, tied=False):
        torch = self.torch
        offsets = torch.tensor([0] + list(sizes), dtype=torch.int64).cumsum(0)
        N = int(offsets[-1])
        if est.binary:
            v = (torch.rand(N, generator=self.gen, dtype=torch.float64) < 0.35).double()
        elif tied:
            v = torch.randint(0, 4, (N,), generator=self.gen).double() / 4
        else:
            v = torch.randn(N, generator=self.gen, dtype=torch.float64)
        d = None
        if est.needs_deltas:
            d = ((torch.rand(N, generator=self.gen, dtype=torch.float64) - 0.5) * 0.6).to(dtype).to(self.device)
        return v.to(dtype).to(self.device), offsets.to(self.device), d

    def compare(self, got, want, dtype) -> str | None:
        torch = self.torch
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
        g, w = got.double().cpu(), want.double().cpu()
        if torch.isnan(g).any() and not torch.equal(torch.isnan(g), torch.isnan(w)):
            return f"{int(torch.isnan(g).sum())} NaN outputs (unwritten or poisoned)"
        fin = torch.isfinite(w)
        if not torch.equal(torch.isfinite(g), fin) or not torch.equal(g[~fin], w[~fin]):
            return "non-finite outputs differ"
        if not fin.any():
            return None
        rel = {torch.float64: 1e-10, torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]
        scale = max(1.0, float(w[fin].abs().max()))
        err = (g[fin] - w[fin]).abs()
        bound = rel * w[fin].abs() + 1e-10 * scale
        if bool((err <= bound).all()):
            return None
        i = int((err - bound).argmax())
        return f"max err {float(err.max()):.3e}; at {i}: got {float(g[fin][i])!r} want {float(w[fin][i])!r}"

    def one(self, label, sizes, est, dtype, k, hint, small_groups=2, tied=False):
        torch = self.torch
        values, offsets, deltas = self.batch(sizes, est, dtype, tied)
        args = (values, offsets, deltas, k, est.code, 0.2 if est.needs_deltas else None, -math.inf, math.inf, True,
                small_groups, 1e-6, max(sizes) if hint else None)
        try:
            want = self.reference.advantages_packed(*args)
            self.sync()
        except Exception as error:  # the reference itself failed: not the kernel's fault, but report it
            self.failures.append(f"{label}: reference raised {error!r}")
            return
        if not self.triton_pass:
            out = torch.full_like(values, float("nan"))
            try:
                got = self.native.advantages_packed(*args, out=out)
                self.sync()
                problem = self.compare(got, want, dtype)
            except Exception as error:
                problem = f"raised {type(error).__name__}: {error}"
            if problem:
                self.failures.append(f"{label}: {problem}")
            else:
                self.passed += 1
        if self.triton is not None and self.triton_pass:
            try:
                got_t = self.triton(*args)
                self.sync()
                problem_t = self.compare(got_t, want, dtype)
            except Exception as error:
                problem_t = f"raised {type(error).__name__}: {str(error)[:200]}"
            if problem_t:
                self.triton_failures.append(f"{label}: {problem_t}")
            else:
                self.triton_passed += 1

    def run_triton(self, budget_s: float):
        """The Triton backend on the same kind of inputs (its failures do not fail this script)."""
        try:
            from bonkernels import triton as bk_triton
            if not bk_triton.available():
                log("[triton] not available")
                return
            self.triton = bk_triton.advantages_packed
        except Exception as error:
            log(f"[triton] not checked: {error!r}")
            return
        torch = self.torch
        self.triton_pass = True
        deadline = time.monotonic() + budget_s
        natives = [e for e in self.estimators.REGISTRY.values() if e.code not in self.native.UNSUPPORTED_CODES]
        try:
            for est in natives:
                for n in (1, 8, 16, 33, 256, 4096):
                    if time.monotonic() > deadline:
                        log(f"[triton] budget spent at {est.name} n={n}")
                        return
                    self.one(f"{est.name} n={n}", [n] * max(1, min(512, 16384 // n)), est, torch.float32, 4 if n >= 4 else 1,
                             hint=True)
                self.one(f"{est.name} ragged", list(RAGGED), est, torch.float64, 3, hint=True)
        finally:
            self.triton_pass = False

    def jobs(self):
        """Checks in priority order, so a spent budget drops the least important ones."""
        torch = self.torch
        natives = [e for e in self.estimators.REGISTRY.values() if e.code not in self.native.UNSUPPORTED_CODES]
        sizes = SIZES if not self.quick else (1, 2, 3, 8, 16, 33, 100)
        ragged = list(RAGGED if not self.quick else (1, 0, 2, 5, 16, 33, 0, 100))
        target_n = 1 << 16 if not self.quick else 1 << 10
        groups = lambda n: max(1, min(2048, target_n // n))  # noqa: E731
        for n in sizes:  # every shape of kernel, every estimator, float64
            for est in natives:
                k = 4 if n >= 4 else 1
                yield (f"{est.name} n={n} G={groups(n)} k={k} float64", [n] * groups(n), est, torch.float64, k, True)
        for est in natives:  # ragged batches: one launch shaped by the largest group
            yield (f"{est.name} ragged k=3 float64", ragged, est, torch.float64, 3, True)
            yield (f"{est.name} ragged k=1 float32 (no hint)", ragged, est, torch.float32, 1, False)
        for n in sizes:
            for est in natives:
                yield (f"{est.name} n={n} k=1 float32 (no hint)", [n] * groups(n), est, torch.float32, 1, False)
        for est in natives:
            for dtype in (torch.float16, torch.bfloat16):
                yield (f"{est.name} ragged k=2 {str(dtype)[6:]}", ragged, est, dtype, 2, True)
            yield (f"{est.name} ties n=16", [16] * 64, est, torch.float64, 4, True, 2, True)
            yield (f"{est.name} ragged small_groups=zero k=5", ragged, est, torch.float64, 5, True, 1)

    def run(self, budget_s: float):
        torch = self.torch
        deadline = time.monotonic() + budget_s
        # A wrong hint must not read out of bounds: the kernel marks such groups with NaN.
        if self.device.type == "cuda":
            est = self.estimators.get("maxk")
            for sizes, hint in (([40, 8], 16), ([300, 8], 100)):
                values, offsets, _ = self.batch(sizes, est, torch.float32)
                try:
                    got = self.native.advantages_packed(values, offsets, None, 2, 0, None, -math.inf, math.inf, True,
                                                        2, 1e-6, hint)
                    self.sync()
                    if not torch.isnan(got[:sizes[0]].cpu()).all():
                        self.failures.append(f"an undersized max_group_size hint ({hint}) did not mark the group "
                                             "with NaN")
                    else:
                        self.passed += 1
                except Exception as error:
                    self.failures.append(f"undersized hint raised {error!r}")
        last_report = time.monotonic()
        for job in self.jobs():
            if time.monotonic() > deadline:
                self.incomplete = f"check budget spent before: {job[0]}"
                return
            label, sizes, est, dtype, k, hint = job[:6]
            rest = job[6:]
            self.one(label, sizes, est, dtype, k, hint, *rest)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                log(f"[check] {elapsed():.0f} s: native {self.passed} ok, {len(self.failures)} failed (at {label})")


# ----------------------------------------------------------------------------- 3. timing

def time_calls(fn, device, warmup=5, repeats=25):
    import torch
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timing(device_name: str, quick: bool, budget_s: float):
    import torch
    from bonkernels import _native, estimators, reference
    device = torch.device(device_name)
    triton = None
    if device.type == "cuda":
        try:
            from bonkernels import triton as bk_triton
            triton = bk_triton.advantages_packed if bk_triton.available() else None
        except Exception:
            triton = None
    cells = [(1024, 16), (4096, 16), (65536, 16), (1 << 20, 16), (4096, 4096), (64, 1024)]
    if device.type == "cpu":
        cells = [(1024, 16), (4096, 16), (64, 1024), (16, 4096)]
    if quick:
        cells = [(256, 16), (64, 256)]
    rows = []
    deadline = time.monotonic() + budget_s
    gen = torch.Generator().manual_seed(7)
    for name in ("maxk_loo1", "maxk_offpolicy", "grpo"):
        est = estimators.get(name)
        for G, n in cells:
            if time.monotonic() > deadline:
                log("[time] budget spent; remaining cells skipped")
                break
            N = G * n
            values = torch.rand(N, generator=gen).to(device)
            offsets = (torch.arange(G + 1, dtype=torch.int64) * n).to(device)
            deltas = ((torch.rand(N, generator=gen) - 0.5) * 0.2).to(device) if est.needs_deltas else None
            args = (values, offsets, deltas, 4, est.code, 0.2 if deltas is not None else None, -math.inf, math.inf,
                    True, 0, 1e-6, n)
            out = torch.empty_like(values)
            row = {"estimator": name, "G": G, "n": n}
            try:
                row["native"] = time_calls(lambda: _native.advantages_packed(*args, out=out), device)
            except Exception as error:
                row["native"] = float("nan")
                log(f"[time] native {name} G={G} n={n} raised {error!r}")
            if triton is not None:
                try:
                    row["triton"] = time_calls(lambda: triton(*args), device)
                except Exception as error:
                    row["triton"] = float("nan")
                    log(f"[time] triton {name} G={G} n={n} raised {str(error)[:200]!r}")
            if N <= (1 << 20):
                try:
                    row["torch"] = time_calls(lambda: reference.advantages_packed(*args), device, warmup=2, repeats=5)
                except Exception:
                    row["torch"] = float("nan")
            traffic = values.numel() * values.element_size() * (3 if deltas is not None else 2)
            src = torch.empty(traffic // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            row["copy"] = time_calls(lambda: dst.copy_(src), device)  # reads + writes the same bytes
            row["bytes"] = traffic
            rows.append(row)
    header = f"{'estimator':15s} {'G':>8s} {'n':>5s} {'native':>10s} {'triton':>10s} {'torch':>10s} {'copy':>10s} {'% copy bw':>9s}"
    log(header)
    log("-" * len(header))
    for r in rows:
        us = lambda key: f"{r[key] * 1e6:9.1f}u" if key in r and r[key] == r[key] else f"{'-':>10s}"  # noqa: E731
        frac = r["copy"] / r["native"] * 100 if r.get("native") == r.get("native") and r.get("native") else float("nan")
        log(f"{r['estimator']:15s} {r['G']:8d} {r['n']:5d} {us('native')} {us('triton')} {us('torch')} "
            f"{us('copy')} {frac:8.0f}%")
    return rows


# ----------------------------------------------------------------------------- main

def child(args) -> int:
    """Checks and timing, in a fresh interpreter that imports the freshly built extension."""
    sys.path.insert(0, ROOT)
    import torch
    from bonkernels import _native
    log(f"[env] python {sys.version.split()[0]}, torch {torch.__version__}, device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    if not _native.available():
        log(f"[check] FAILED: the extension did not load: {_native.load_error()}")
        return 1
    if args.device == "cuda" and not _native.cuda_available():
        log("[check] FAILED: the extension has no CUDA kernels (was it built with nvcc?)")
        return 1
    checker = Checker(args.device, args.quick)
    try:
        checker.run(budget_s=args.check_budget_s)
    except Exception:
        checker.failures.append("checker crashed:\n" + traceback.format_exc())
    log(f"[check] native: {checker.passed} passed, {len(checker.failures)} failed")
    if checker.incomplete:
        log(f"[check] NOTE: not every check ran ({checker.incomplete})")
    for f in checker.failures[:40]:
        log("  FAIL " + f)
    if args.device == "cuda":
        try:
            checker.run_triton(budget_s=args.triton_budget_s)
        except Exception:
            checker.triton_failures.append("triton pass crashed:\n" + traceback.format_exc())
    if checker.triton is not None:
        log(f"[check] triton: {checker.triton_passed} passed, {len(checker.triton_failures)} failed")
        for f in checker.triton_failures[:15]:
            log("  TRITON FAIL " + f)
    try:
        timing(args.device, args.quick, budget_s=args.time_budget_s)
    except Exception:
        log("[time] crashed:\n" + traceback.format_exc())
    return 0 if not checker.failures else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="cuda (default when a GPU is visible) or cpu (the CPU kernel through the same code)")
    parser.add_argument("--dry-run", action="store_true", help="--device cpu, small sizes, no build")
    parser.add_argument("--no-build", action="store_true", help="use the extension as it is")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--build-timeout-s", type=float, default=170)
    parser.add_argument("--deadline-s", type=float, default=340, help="hard stop for the whole script")
    parser.add_argument("--check-budget-s", type=float, default=80)
    parser.add_argument("--triton-budget-s", type=float, default=50)
    parser.add_argument("--time-budget-s", type=float, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.no_build, args.quick = "cpu", True, True
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        return child(args)
    ok = True
    if not args.no_build:
        ok = build(args.build_timeout_s)
        if not ok and elapsed() < 110:
            log("[build] retrying by the bare-nvcc route (BONKERNELS_BARE_NVCC=1)")
            os.environ["BONKERNELS_BARE_NVCC"] = "1"
            ok = build(max(30.0, 200 - elapsed()))
        if not ok:
            log("[build] the checks below use whatever extension is importable")
    # Whatever the build took, the whole script stops by --deadline-s (the device run is one shot).
    limit = max(30.0, args.deadline_s - elapsed())
    spare = limit - 40  # interpreter start, CUDA init, table printing
    wanted = args.check_budget_s + args.triton_budget_s + args.time_budget_s
    if spare < wanted:
        shrink = max(spare, 30.0) / wanted
        args.check_budget_s *= shrink
        args.triton_budget_s *= shrink
        args.time_budget_s *= shrink
        log(f"[done] budgets shrunk by {shrink:.2f} to finish by {args.deadline_s:.0f} s")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", args.device,
           "--check-budget-s", str(args.check_budget_s), "--time-budget-s", str(args.time_budget_s),
           "--triton-budget-s", str(args.triton_budget_s)]
    if args.quick:
        cmd.append("--quick")
    try:
        rc = subprocess.call(cmd, cwd=ROOT, timeout=limit)
    except subprocess.TimeoutExpired:
        log(f"[done] the checks exceeded {limit:.0f} s and were stopped")
        rc = 1
    log(f"[done] {'OK' if ok and rc == 0 else 'FAILED'} in {elapsed():.0f} s")
    return 0 if ok and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
