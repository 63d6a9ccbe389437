"""One-shot GPU check: build the extension, check every GPU path against float64 references, time.

    python bench/gpu_check.py --out DIR            # the GPU machine: build + every check (< 7 min; 4 on one H200)
    python bench/gpu_check.py --device cpu --out DIR   # the same checks and sizes on the CPU kernel (no build)
    python bench/gpu_check.py --dry-run --out DIR  # --device cpu, tiny sizes, Triton under its interpreter (CI)

Exit status 0 only when every check passed and none was left out for time; the log
(DIR/gpu_check.log) and a JSON summary (DIR/summary.json: route, per-section pass/fail/skip counts,
every failure message) are written either way.

What runs (each section in a fresh interpreter, so one crashed CUDA context loses one section):
* build: ``setup.py build_ext --inplace`` by the torch-CUDA route (torch's CUDAExtension) for the
  visible GPU's architecture; a failed build FAILS the check (no silent fallback), and the section
  asserts ``torch.ops.bonkernels.build_info()`` reports that route. ``--route bare-nvcc`` checks the
  bare-nvcc build instead. The bare route is also built into a scratch package and its stream and
  graph sections run, when time allows (logged either way). Beside the build, 6 processes compile
  the Triton kernels the sections will launch (one per estimator, dtype, block and layout: about
  600, 1-5 s each) into Triton's cache (DIR/triton_cache_fill.txt).
* kernels: every native estimator through every CUDA kernel variant (group sizes in each bucket:
  <=8, <=16, <=32, <=256, (256, 512], (512, 1024], (1024, 2048], (2048, 4096], launched at each
  bucket's bound and without a hint), float64/float32 (float16/bfloat16 on a subset), both scales,
  finite clips, eps=0, small_groups zero/clamp; outputs poisoned, with guard zones around them.
  Rewards are normal draws, ties, or values a few float32 ulps apart (they reach the exact step
  after the small-group kernel's packed sort at n = 17..32).
* triton: every Triton block size (8 .. 4096) and dtype, the same comparisons; on a GPU each launch
  (its estimator's own kernel) also bit for bit against the kernel with every estimator.
* adversarial-native / adversarial-triton (checks off): the NaN contract (a group with a NaN/inf
  reward or delta is NaN everywhere, the others exact), malformed offsets (negative, decreasing,
  past the end) and an undersized max_group_size: nothing written outside the output (guard
  zones), no CUDA error, oversize groups NaN-filled.
* streams: rewards produced on a side stream (behind a sleep) and the op called inside
  ``torch.cuda.stream(s)``; tensors on cuda:1 while cuda:0 is current (when there are 2 GPUs).
* graphs: CUDA-graph capture with the size hint (native, triton, public API), replayed on new
  inputs; and zero host syncs with checks off (``torch.cuda.set_sync_debug_mode("error")``).
* api: ``bk.advantages`` / ``pass_at_k`` / ``max_at_k`` on CUDA tensors for every layout and
  backend; mixtures (``k_weights``, when the API has it) and ``maxrl`` (when registered).
* policy_loss: the Triton policy-loss kernel, forward and backward, against the reference.
* sanitizer: ``compute-sanitizer`` memcheck, racecheck and synccheck on small inputs of every
  CUDA kernel variant (NaN groups and malformed offsets included); skipped with a logged reason
  when the tool is absent.
* timing: a short table against a plain copy of the same bytes (informational).
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = time.monotonic()
LOG_FILE = None
TRITON_CACHE_FILL = None  # the process compiling Triton kernels ahead (start_triton_cache_fill)

# Bound of each CUDA kernel shape (csrc/cuda/advantages.cu) and group sizes inside its bucket; the
# last entries mix small and large groups under one bound (the launcher's two kernels, size buckets).
# At 64 the kWide and kWideOffPolicy calls run groups of exactly 64 one per thread: (64,) gives
# that kernel whole blocks of them, (1, 5, 16, 63, 64) mixes them with the segment kernel's.
CUDA_BUCKETS = ((8, (1, 2, 5, 8)), (16, (9, 16)), (32, (17, 31, 32)), (64, (33, 50, 64)), (64, (64,)),
                (128, (65, 100, 128)), (256, (129, 200, 256)),
                (512, (257, 300, 512)), (1024, (513, 700, 1024)), (2048, (1025, 1500, 2048)),
                (4096, (2049, 4096)), (32, (3, 16, 17, 32)), (64, (1, 5, 16, 63, 64)),
                (256, (1, 8, 13, 16, 17, 64, 256)))
QUICK_BUCKETS = ((8, (1, 2, 5, 8)), (16, (9, 16)), (32, (17, 32)), (64, (33, 64)), (256, (33, 100)), (512, (257, 300)),
                 (64, (5, 16, 17, 64)))
# Child processes per Triton section on a GPU (4 triton + 4 adversarial-triton children beside the others;
# 2 each with --quick or --dry-run)
TRITON_SHARDS = 4
# The estimators the triton section also runs at float64, float16 and bfloat16 (all at float32)
TRITON_EVERY_DTYPE = ("maxk_loo1", "maxk_offpolicy", "grpo", "bon_mean", "maxk_loo")
TRITON_CACHE_FILL_JOBS = 6  # processes that compile them ahead, beside the build (start_triton_cache_fill)
SECTIONS = ("kernels", "triton", "adversarial-native", "adversarial-triton", "streams", "graphs", "api",
            "plans", "policy_loss")


def log(msg: str = "") -> None:
    print(msg, flush=True)
    if LOG_FILE is not None:
        LOG_FILE.write(msg + "\n")
        LOG_FILE.flush()


def elapsed() -> float:
    return time.monotonic() - START


# ============================================================================= build (parent)

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
            for token in open(nvcc, errors="replace").read(4096).split():
                if token.endswith("/bin/nvcc") and os.path.exists(token):
                    return os.path.dirname(os.path.dirname(token))
        except OSError:
            pass
    for cand in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
        if os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    return None


def build(route: str, timeout_s: float, build_lib: str | None = None) -> bool:
    """Build by `route` ("torch-cuda" or "bare-nvcc"); in place, or into build_lib."""
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
    if "BONKERNELS_CUDA_ARCHS" not in env and "TORCH_CUDA_ARCH_LIST" in env:
        env["BONKERNELS_CUDA_ARCHS"] = env["TORCH_CUDA_ARCH_LIST"].replace(".", "").replace("a", "").split(";")[0]
    env["BONKERNELS_FORCE_CUDA"] = "1"
    env.pop("BONKERNELS_SKIP_CUDA", None)
    env.pop("BONKERNELS_SKIP_EXT", None)
    if route == "bare-nvcc":
        env["BONKERNELS_BARE_NVCC"] = "1"
    else:
        env.pop("BONKERNELS_BARE_NVCC", None)
    cmd = [sys.executable, "setup.py", "build_ext"]
    if build_lib:
        cmd += ["--build-lib", build_lib, "--build-temp", os.path.join(build_lib, "temp")]
    else:
        cmd += ["--inplace"]
    log(f"[build] route {route}: CUDA_HOME={cuda_home} TORCH_CUDA_ARCH_LIST={env.get('TORCH_CUDA_ARCH_LIST')} "
        f"torch={torch.__version__} cuda={torch.version.cuda}{' -> ' + build_lib if build_lib else ''}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
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


# ============================================================================= checks (children)

def maxrl_reference(values, offsets, clip_lo, clip_hi, mean_scale=True):
    """maxrl in float64 where bonkernels.reference lacks it (spec 12): (x_i - m) / m per group, m the
    mean taken around the group's first sample, 0 when m == 0 (natural scale: mean)."""
    import torch
    out = torch.zeros_like(values)
    for g in range(offsets.numel() - 1):
        x = values[int(offsets[g]):int(offsets[g + 1])]
        if x.numel() == 0:
            continue
        m = x[0] + (x - x[0]).mean()
        a = torch.zeros_like(x) if m == 0 or x.numel() == 1 else (x - m) / m
        if not mean_scale:
            a = a / x.numel()
        out[int(offsets[g]):int(offsets[g + 1])] = a.clamp(clip_lo, clip_hi)
    return out


class Report:
    """Pass/fail/skip counts and messages per section."""

    def __init__(self, json_path=None):
        self.sections: dict[str, dict] = {}
        self.json_path = json_path
        self.count = 0

    def flush(self):
        """Written as it goes, so a child stopped at the deadline still reports what it checked."""
        if self.json_path:
            with open(self.json_path + ".tmp", "w") as f:
                json.dump(self.sections, f, indent=1, default=str)
            os.replace(self.json_path + ".tmp", self.json_path)

    def _s(self, section):
        return self.sections.setdefault(section, {"passed": 0, "failed": [], "skipped": []})

    def ok(self, section):
        self._s(section)["passed"] += 1

    def fail(self, section, msg):
        self._s(section)["failed"].append(msg)
        log(f"  FAIL [{section}] {msg}")

    def skip(self, section, reason):
        self._s(section)["skipped"].append(reason)
        log(f"  SKIP [{section}] {reason}")

    def check(self, section, label, problem):
        if problem:
            self.fail(section, f"{label}: {problem}")
        else:
            self.ok(section)
        self.count += 1
        if self.count % 25 == 0:
            self.flush()


class Ctx:
    """Shared state of a child: the device, generators, the backends."""

    def __init__(self, device: str, quick: bool, report: Report, budget_s: float = 1e9):
        import torch
        import bonkernels as bk
        from bonkernels import _native, estimators, reference
        self.torch, self.bk, self.native, self.estimators, self.reference = torch, bk, _native, estimators, reference
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.quick = quick
        self.report = report
        self.stop_at = time.monotonic() + budget_s
        # "i/m": this child runs every m-th block size or bucket from the i-th (the Triton sections
        # compile a kernel per block size and dtype; shards spread that over the machine's cores)
        index, count = os.environ.get("BK_GPU_CHECK_SHARD", "0/1").split("/")
        self.shard = (int(index), int(count))
        self.gen = torch.Generator().manual_seed(int(time.time()) % 100000)  # fresh inputs every run
        log(f"[inputs] seed {self.gen.initial_seed()}")
        self.natives = [e for e in estimators.REGISTRY.values() if e.code not in _native.UNSUPPORTED_CODES]
        self.triton = None
        try:
            from bonkernels import triton as bk_triton
            if bk_triton.available() and (self.cuda or bk_triton.interpreting()):
                self.triton = bk_triton.advantages_packed
                from bonkernels.triton import _config
                self.triton_blocks = _config.all_blocks()
        except Exception as error:  # reported by the triton section
            self.triton_error = repr(error)

    def in_shard(self, i: int) -> bool:
        return i % self.shard[1] == self.shard[0]

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def out_of_time(self, section, label) -> bool:
        """True (and a recorded failure, once per section) when the child's budget is spent."""
        if time.monotonic() < self.stop_at:
            return False
        s = self.report._s(section)
        if not s.get("out_of_time"):
            s["out_of_time"] = True
            self.report.fail(section, f"out of time: not run from {label} on")
        return True

    # ------------------------------------------------------------------ inputs and references

    def rewards(self, N, est, dtype):
        torch = self.torch
        if est.binary:
            v = (torch.rand(N, generator=self.gen, dtype=torch.float64) < 0.4).double()
        elif est.name == "maxrl":  # rewards >= 0
            v = torch.rand(N, generator=self.gen, dtype=torch.float64) * 2
        else:
            u = torch.rand(1, generator=self.gen).item()
            if u < 0.25:  # ties
                v = torch.randint(0, 4, (N,), generator=self.gen).double() / 4
            elif u < 0.4:  # a few float32 ulps apart: the packed sort's exact step (groups of 17..32)
                base = 1.0 + torch.rand(1, generator=self.gen, dtype=torch.float64)
                v = base * (1.0 + torch.randint(0, 96, (N,), generator=self.gen).double() * 2.0**-23)
            else:
                v = torch.randn(N, generator=self.gen, dtype=torch.float64)
        return v.to(dtype)

    def batch(self, sizes, est, dtype):
        torch = self.torch
        offsets = torch.tensor([0] + list(sizes), dtype=torch.int64).cumsum(0)
        N = int(offsets[-1])
        values = self.rewards(N, est, dtype)
        deltas = None
        if est.needs_deltas:
            deltas = ((torch.rand(N, generator=self.gen, dtype=torch.float64) - 0.5) * 0.6).to(dtype)
        return values, offsets, deltas

    def want(self, args):
        """float64 reference on the CPU from the (dtype-rounded) inputs, rounded to the output dtype."""
        values, offsets, deltas = args[0], args[1], args[2]
        dtype = values.dtype
        cpu = lambda t: None if t is None else t.detach().to("cpu", self.torch.float64)  # noqa: E731
        rest = list(args[3:11])  # no size hint: the reference needs none
        if args[4] == getattr(self.estimators.REGISTRY.get("maxrl"), "code", None) and not self.reference_has_maxrl():
            w = maxrl_reference(cpu(values), cpu(offsets).long(), rest[3], rest[4], rest[5])
        else:
            w = self.reference.advantages_packed(cpu(values), cpu(offsets).long(), cpu(deltas), *rest, None)
        return w.to(dtype).double()

    def reference_has_maxrl(self):
        torch = self.torch
        try:
            self.reference.advantages_packed(torch.ones(2, dtype=torch.float64), torch.tensor([0, 2]), None, 1,
                                             self.estimators.get("maxrl").code, None, -math.inf, math.inf, True, 2,
                                             1e-6, None)
            return True
        except ValueError:
            return False

    def compare(self, got, want, dtype) -> str | None:
        torch = self.torch
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
        g, w = got.detach().double().cpu(), want.double().cpu()
        if not torch.equal(torch.isnan(g), torch.isnan(w)):
            bad = int((torch.isnan(g) != torch.isnan(w)).sum())
            return f"{bad} outputs NaN where the reference is not (or the reverse): unwritten or poisoned"
        fin = torch.isfinite(w)
        if not torch.equal(torch.isfinite(g), fin) or not torch.equal(g[~fin & ~torch.isnan(w)],
                                                                         w[~fin & ~torch.isnan(w)]):
            return "non-finite outputs differ"
        if not fin.any():
            return None
        rel = {torch.float64: 1e-10, torch.float32: 2 ** -22, torch.float16: 2 ** -9, torch.bfloat16: 2 ** -6}[dtype]
        scale = max(1.0, float(w[fin].abs().max()))
        err = (g[fin] - w[fin]).abs()
        bound = rel * w[fin].abs() + 1e-9 * scale
        if bool((err <= bound).all()):
            return None
        i = int((err - bound).argmax())
        return f"max err {float(err.max()):.3e}; at {i}: got {float(g[fin][i])!r} want {float(w[fin][i])!r}"

    def guarded(self, like, fill=math.nan, pad=1024):
        """A poisoned output with guard zones around it: (view, whole buffer, pad)."""
        buf = self.torch.full((like.numel() + 2 * pad,), fill, dtype=like.dtype, device=self.device)
        buf[:pad] = -1024.0
        buf[-pad:] = -1024.0
        return buf[pad:pad + like.numel()], buf, pad

    def guard_problem(self, buf, pad) -> str | None:
        head, tail = buf[:pad].double().cpu(), buf[-pad:].double().cpu()
        if bool((head != -1024.0).any()) or bool((tail != -1024.0).any()):
            return "WROTE OUTSIDE THE OUTPUT (guard zone changed)"
        return None

    def run_backend(self, which, args, guard=True):
        """Call one backend with an explicit poisoned output where it takes one; -> (got, problem)."""
        if which == "native":
            out, buf, pad = self.guarded(args[0])
            got = self.native.advantages_packed(*args, out=out)
            self.sync()
            return got, (self.guard_problem(buf, pad) if guard else None)
        got = self.triton(*args)
        self.sync()
        return got, None

    def dev(self, t):
        return None if t is None else t.to(self.device)


# ----------------------------------------------------------------------------- kernels / triton

def variants(ctx, est):
    """(dtype, mean_scale, clip, eps, small_groups, k) combinations for one estimator."""
    torch = ctx.torch
    k = int(torch.randint(1, 9, (1,), generator=ctx.gen))
    out = [(torch.float64, True, (-math.inf, math.inf), 1e-6, 2, k),
           (torch.float32, False, (-0.7, 0.9), 0.0, 1, max(1, k // 2))]
    if not ctx.quick and est.name in ("maxk_loo1", "grpo", "maxk_offpolicy", "maxk", "rloo", "maxrl"):
        out += [(torch.float16, True, (-math.inf, math.inf), 1e-6, 2, 3),
                (torch.bfloat16, False, (-2.0, 2.0), 0.0, 2, 2)]
    return out


def args_for(ctx, est, values, offsets, deltas, variant, hint):
    dtype, mean_scale, (lo, hi), eps, small, k = variant
    return (ctx.dev(values), ctx.dev(offsets), ctx.dev(deltas), k, est.code, 0.25 if est.needs_deltas else None,
            lo, hi, mean_scale, small, eps, hint)


def section_kernels(ctx):
    rep = ctx.report
    buckets = QUICK_BUCKETS if ctx.quick else CUDA_BUCKETS
    target = 2048 if ctx.quick else 1 << 15
    for bound, sizes in buckets:
        reps = max(1, target // (sum(sizes) + 1))
        ragged = [s for _ in range(reps) for s in sizes] + [0]
        for est in ctx.natives:
            if ctx.out_of_time("kernels", f"{est.name} bucket<={bound}"):
                return
            for variant in variants(ctx, est):
                values, offsets, deltas = ctx.batch(ragged, est, variant[0])
                for hint in (bound, None):
                    args = args_for(ctx, est, values, offsets, deltas, variant, hint)
                    label = (f"{est.name} bucket<={bound} sizes={sizes} {str(variant[0])[6:]} mean={variant[1]} "
                             f"clip={variant[2]} eps={variant[3]} small={variant[4]} k={variant[5]} hint={hint}")
                    try:
                        got, problem = ctx.run_backend("native", args)
                        problem = problem or ctx.compare(got, ctx.want(args), variant[0])
                    except Exception as error:
                        problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                    rep.check("kernels", label, problem)


def triton_layouts(which, block, est):
    """(label suffix, context) per Triton layout a launch of this block can take: blocks up to 16
    (32 for an on-policy launch running its estimator's own kernel on 16- or 32-bit rewards, 64
    for the registry's centred estimators: grpo, rloo, dr_grpo and maxrl) run a thread per group only from
    _config.LANE_MIN_GROUPS groups up, more than a check's batch, so the lanes get a pass of
    their own with the threshold lowered."""
    import contextlib

    from bonkernels.triton import _config

    layouts = [("", contextlib.nullcontext)]
    if which == "triton" and block is not None and block <= _config.estimator_lanes_up_to(est):
        layouts.append((" lanes", lambda: _config.lane_threshold(1)))
    return layouts


def section_triton(ctx):
    rep = ctx.report
    if ctx.triton is None:
        if ctx.cuda:
            rep.fail("triton", f"Triton backend not usable on CUDA: {getattr(ctx, 'triton_error', 'not installed')}")
        else:
            rep.skip("triton", "no CUDA device and the Triton interpreter is off")
        return
    from bonkernels.triton import _config

    torch = ctx.torch
    blocks = ctx.triton_blocks if not ctx.quick else [8, 64]
    dtypes = (torch.float64, torch.float32, torch.float16, torch.bfloat16) if not ctx.quick else (torch.float32,)
    for block in [b for i, b in enumerate(blocks) if ctx.in_shard(i)]:
        lo = block // 2 + 1 if block > 8 else 1
        sizes = sorted({lo, (lo + block) // 2, block})
        reps = max(1, (256 if ctx.quick else 1 << 14) // sum(sizes))
        ragged = [s for _ in range(reps) for s in sizes] + [0]
        for dtype in dtypes:
            ests = ctx.natives if dtype == torch.float32 else [e for e in ctx.natives if e.name in TRITON_EVERY_DTYPE]
            if ctx.quick:
                ests = [e for e in ests if e.name in ("maxk", "maxk_offpolicy", "grpo")]
            for est in ests:
                if ctx.out_of_time("triton", f"{est.name} block={block} {dtype}"):
                    return
                for variant, (suffix, layout) in itertools.product(variants(ctx, est)[:2],
                                                                    triton_layouts("triton", block, est)):
                    variant = (dtype,) + variant[1:]
                    values, offsets, deltas = ctx.batch(ragged, est, dtype)
                    args = args_for(ctx, est, values, offsets, deltas, variant, block)
                    label = (f"{est.name} block={block} {str(dtype)[6:]} mean={variant[1]} clip={variant[2]} "
                             f"eps={variant[3]} small={variant[4]} k={variant[5]}{suffix}")
                    try:
                        with layout():
                            got, _ = ctx.run_backend("triton", args)
                        problem = ctx.compare(got, ctx.want(args), dtype)
                        if (problem is None and ctx.cuda
                                and (not suffix or block <= _config.OWN_KERNEL_LANE_MAX_BLOCK)):
                            # (above it only the centred estimators' own kernels run lanes)
                            problem = _same_as_generic_kernel(ctx, args, got, layout)
                    except Exception as error:
                        problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                    rep.check("triton", label, problem)
        if ctx.out_of_time("triton", f"from a bank block={block}"):
            return
        _serial_lanes_from_a_bank(ctx, block, ragged)


def _serial_lanes_from_a_bank(ctx, block, ragged):
    """From a bank, the registry's `one_pass` estimators go through a group a column at a
    time, in their own kernels, with a thread per group up to _config.serial_lanes_up_to
    (maxk_offpolicy at 32, maxk, passk and maxk_loo1 at 64): one k's bank on a ragged batch in
    that layout, against the float64 reference and, on a GPU up to block 32, bit for bit against
    the kernel with every estimator in the same layout (its tile code)."""
    from bonkernels import tables
    from bonkernels.triton import _config

    torch = ctx.torch
    for est in [e for e in ctx.natives if getattr(e, "one_pass", False)]:
        name, top = est.name, _config.serial_lanes_up_to(est, True)
        if block > top or (ctx.quick and name not in ("maxk", "maxk_offpolicy")):
            continue
        # (bfloat16 for the estimators the cache fill compiles at every dtype)
        for dtype in (torch.float32,) + ((torch.bfloat16,) if name in TRITON_EVERY_DTYPE and not ctx.quick else ()):
            k = 3
            values, offsets, deltas = ctx.batch(ragged, est, dtype)
            args = args_for(ctx, est, values, offsets, deltas, (dtype, True, (-math.inf, math.inf), 1e-6, 2, k),
                            block)
            bank, bank_index = tables.build_bank(name, (0.0,) * (k - 1) + (1.0,), tuple(range(1, block + 1)), 2,
                                                 ctx.device)
            try:
                with _config.lane_threshold(1):
                    got = ctx.triton(*args, bank=bank, bank_index=bank_index)
                    ctx.sync()
                problem = ctx.compare(got, ctx.want(args), dtype)
                if problem is None and ctx.cuda and block <= _config.OWN_KERNEL_LANE_MAX_BLOCK:
                    # (above, the kernel with every estimator takes lanes in no launch)
                    same_layout = _config.takes_own_kernel_lanes(True, dtype)
                    with (_config.lane_threshold(1), _config.specialised_kernels(False),
                          _config.own_kernel_lanes(same_layout)):
                        generic = ctx.triton(*args, bank=bank, bank_index=bank_index)
                        ctx.sync()
                    as_int = {2: torch.int16, 4: torch.int32}[got.element_size()]
                    if not torch.equal(got.view(as_int), generic.view(as_int)):
                        problem = "a column at a time differs from the tile code of the kernel with every estimator"
            except Exception as error:
                problem = f"raised {type(error).__name__}: {str(error)[:300]}"
            ctx.report.check("triton", f"{name} block={block} {str(dtype)[6:]} k={k} from a bank, lanes", problem)


def _same_as_generic_kernel(ctx, args, got, layout):
    """A launch on a GPU runs the kernel compiled for its estimator: it must give the bits of the
    kernel with every estimator, in the same layout (the kernel with every estimator takes lanes
    at block 32 only when told to)."""
    from bonkernels.triton import _config

    same_layout = _config.takes_own_kernel_lanes(True, got.dtype)
    with layout(), _config.specialised_kernels(False), _config.own_kernel_lanes(same_layout):
        generic, _ = ctx.run_backend("triton", args)
    as_int = {2: ctx.torch.int16, 4: ctx.torch.int32, 8: ctx.torch.int64}[got.element_size()]
    if not ctx.torch.equal(got.view(as_int), generic.view(as_int)):
        return "the estimator's own kernel differs from the kernel with every estimator"
    return None


# ----------------------------------------------------------------------------- adversarial (checks off)

def adversarial(ctx, which):
    section = f"adversarial-{which}"
    rep = ctx.report
    torch = ctx.torch
    if which == "triton" and ctx.triton is None:
        if ctx.cuda:
            rep.fail(section, "Triton backend not usable on CUDA")
        else:
            rep.skip(section, "no CUDA device and the Triton interpreter is off")
        return
    buckets = ((8, (1, 5, 8)), (32, (17, 32)), (256, (33, 100))) if ctx.quick else CUDA_BUCKETS
    specials = (math.nan, math.inf, -math.inf)
    names = ("maxk", "maxk_loo1", "grpo", "maxk_offpolicy", "bon_max_second", "maxrl")
    ests = [e for e in ctx.natives if e.name in names]
    # 1. the NaN contract
    for bound, sizes in [b for i, b in enumerate(buckets) if ctx.in_shard(i)]:
        ragged = [s for _ in range(3) for s in sizes]
        offs = [0]
        for s in ragged:
            offs.append(offs[-1] + s)
        for est in ests:
            if ctx.out_of_time(section, f"NaN contract {est.name} bucket<={bound}"):
                return
            for dtype in (torch.float32, torch.float64):
                values, offsets, deltas = ctx.batch(ragged, est, dtype)
                bad_groups = set()
                for g, s in enumerate(ragged):
                    if g % 3 == 1:  # one bad sample per poisoned group, anywhere in it
                        pos = offs[g] + int(torch.randint(0, s, (1,), generator=ctx.gen))
                        special = specials[g % len(specials)]
                        if est.needs_deltas and g % 2 == 0:
                            deltas[pos] = special
                        else:
                            values[pos] = special
                        bad_groups.add(g)
                clean_v = values.clone()
                clean_d = None if deltas is None else deltas.clone()
                for g in bad_groups:
                    clean_v[offs[g]:offs[g + 1]] = 0.5
                    if clean_d is not None:
                        clean_d[offs[g]:offs[g + 1]] = 0.0
                variant = (dtype, True, (-math.inf, math.inf), 1e-6, 2, 2)
                args = args_for(ctx, est, values, offsets, deltas, variant, bound if ctx.cuda else None)
                for suffix, layout in triton_layouts(which, bound, est):
                    label = f"NaN contract {est.name} bucket<={bound} {str(dtype)[6:]}{suffix}"
                    try:
                        want = ctx.want(args_for(ctx, est, clean_v, offsets, clean_d, variant, None))
                        for g in bad_groups:
                            want[offs[g]:offs[g + 1]] = math.nan
                        with layout():
                            got, problem = ctx.run_backend(which, args)
                        problem = problem or ctx.compare(got, want, dtype)
                    except Exception as error:
                        problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                    rep.check(section, label, problem)
    if ctx.shard[0] != 0:
        return  # the cases below run in the first shard
    # 2. malformed offsets: no access outside the tensors, no CUDA error (values are undefined)
    est = ctx.estimators.get("maxk_loo1")
    N = 40
    cases = {"decreasing": [0, 10, 5, 30, 40], "past the end": [0, 10, 20, 45, 60], "negative": [-8, 3, 10, 40, 40],
             "start past the end": [0, 10, 50, 40, 40], "huge": [0, 2 ** 40, 3, 40, 40]}
    for name, offs in cases.items():
        values = ctx.rewards(N, est, torch.float32)
        offsets = torch.tensor(offs, dtype=torch.int64)
        for hint, (suffix, layout) in ((h, lay) for h in ((8, 32, 300, 4096) if ctx.cuda else (None,))
                                       for lay in triton_layouts(which, h, est)):
            args = args_for(ctx, est, values, offsets, None, (torch.float32, True, (-math.inf, math.inf), 1e-6, 2, 2),
                            hint)
            label = f"malformed offsets ({name}) hint={hint}{suffix}"
            try:
                with layout():
                    _, problem = ctx.run_backend(which, args)
                if which == "triton":  # no out= on this backend: check the device is still sane
                    probe = torch.ones(4, device=ctx.device).sum().item()
                    problem = None if probe == 4.0 else "device in a bad state"
            except Exception as error:
                # A clear refusal (ValueError: the CPU kernel's bounds check, or a backend that
                # measured the groups without a hint) is safe; a fault or any other error is not.
                refused = isinstance(error, ValueError) and not (ctx.cuda and which == "native" and hint)
                problem = None if refused else f"raised {type(error).__name__}: {str(error)[:300]}"
            rep.check(section, label, problem)
    # 3. an undersized max_group_size: larger groups NaN-filled, the others exact. Every oversize
    # group here is above each backend's launch bound for that hint (CUDA bucket, Triton block).
    est = ctx.estimators.get("maxk")
    cases = (([40, 8, 3], 16), ([300, 8], 100), ([700, 20], 512), ([3000, 9], 2048), ([12, 9], 8))
    for sizes, hint in (cases[:2] + cases[-1:] if ctx.quick else cases):
        values, offsets, _ = ctx.batch(sizes, est, torch.float32)
        variant = (torch.float32, True, (-math.inf, math.inf), 1e-6, 2, 2)
        args = args_for(ctx, est, values, offsets, None, variant, hint)
        want = ctx.want(args_for(ctx, est, values, offsets, None, variant, None))
        for g, s in enumerate(sizes):
            if s > hint:
                want[sum(sizes[:g]):sum(sizes[:g + 1])] = math.nan
        for suffix, layout in triton_layouts(which, hint, est):
            label = f"undersized hint {hint} for sizes {sizes}{suffix}"
            try:
                with layout():
                    got, problem = ctx.run_backend(which, args)
                problem = problem or ctx.compare(got, want, torch.float32)
            except Exception as error:
                problem = f"raised {type(error).__name__}: {str(error)[:300]}"
            rep.check(section, label, problem)


# ----------------------------------------------------------------------------- streams and graphs

def backends_for(ctx):
    out = [("native", lambda *a: ctx.native.advantages_packed(*a))]
    if ctx.triton is not None:
        out.append(("triton", lambda *a: ctx.triton(*a)))
    return out


def section_streams(ctx):
    rep = ctx.report
    torch = ctx.torch
    if not ctx.cuda:
        rep.skip("streams", "no CUDA device")
        return
    est = ctx.estimators.get("maxk_loo1")
    for n in (8, 32, 300, 1500):
        sizes = [n] * max(1, 8192 // n)
        values, offsets, _ = ctx.batch(sizes, est, torch.float32)
        variant = (torch.float32, True, (-math.inf, math.inf), 1e-6, 2, 2)
        want = ctx.want(args_for(ctx, est, values, offsets, None, variant, None))
        for name, fn in backends_for(ctx) + [("api", None)]:
            side = torch.cuda.Stream()
            src = values.to(ctx.device)
            off = offsets.to(ctx.device)
            torch.cuda.synchronize()
            try:
                with torch.cuda.stream(side):
                    dst = torch.full_like(src, math.nan)  # poison, then the rewards arrive late on `side`
                    torch.cuda._sleep(50_000_000)
                    dst.copy_(src)
                    if fn is None:
                        got = ctx.bk.advantages(dst, 2, est.name, offsets=off, check_inputs=False,
                                                max_group_size=n, backend="cuda")
                    else:
                        got = fn(dst, off, None, 2, est.code, None, -math.inf, math.inf, True, 2, 1e-6, n)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                problem = ctx.compare(got, want, torch.float32)
            except Exception as error:
                problem = f"raised {type(error).__name__}: {str(error)[:300]}"
            rep.check("streams", f"{name} inside torch.cuda.stream(side), n={n}", problem)
    if torch.cuda.device_count() < 2:
        rep.skip("streams", "device guard on cuda:1: only one GPU")
        return
    values, offsets, _ = ctx.batch([16] * 64, est, torch.float32)
    want = ctx.want(args_for(ctx, est, values, offsets, None, (torch.float32, True, (-math.inf, math.inf), 1e-6, 2, 2),
                             None))
    for name, fn in backends_for(ctx):
        try:
            torch.cuda.set_device(0)
            got = fn(values.to("cuda:1"), offsets.to("cuda:1"), None, 2, est.code, None, -math.inf, math.inf, True, 2,
                     1e-6, 16)
            torch.cuda.synchronize(1)
            problem = ctx.compare(got, want, torch.float32)
        except Exception as error:
            problem = f"raised {type(error).__name__}: {str(error)[:300]}"
        rep.check("streams", f"{name} on cuda:1 while cuda:0 is current", problem)


def captured_and_replayed(torch, call, refill):
    """call() run twice on a side stream (its warm-up), then captured in a CUDA graph; refill()
    writes new inputs into the call's tensors and the graph is replayed. Returns (the warm-up's
    last output, the graph's output after the replay, what refill returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm = [call() for _ in range(2)][-1]
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = call()
    refilled = refill()
    graph.replay()
    torch.cuda.synchronize()
    return warm, static_out, refilled


def section_graphs(ctx):
    rep = ctx.report
    torch = ctx.torch
    if not ctx.cuda:
        rep.skip("graphs", "no CUDA device")
        return
    for est_name in ("maxk_loo1", "maxk_offpolicy", "grpo"):
        est = ctx.estimators.get(est_name)
        for n in (16, 300):
            G = max(1, 4096 // n)
            calls = [(name, fn) for name, fn in backends_for(ctx)] + [("api-cuda", "cuda"), ("api-auto", "auto")]
            if ctx.triton is not None:
                calls.append(("api-triton", "triton"))
            for name, fn in calls:
                values, offsets, deltas = ctx.batch([n] * G, est, torch.float32)
                static_v = values.to(ctx.device)
                static_d = None if deltas is None else deltas.to(ctx.device)
                off = offsets.to(ctx.device)

                def call():
                    if isinstance(fn, str):
                        return ctx.bk.advantages(static_v.view(G, n), 2, est.name, deltas=None if static_d is None
                                                 else static_d.view(G, n), clamp_delta=0.25 if est.needs_deltas else None,
                                                 check_inputs=False, max_group_size=n, backend=fn).reshape(-1)
                    return fn(static_v, off, static_d, 2, est.code, 0.25 if est.needs_deltas else None, -math.inf,
                              math.inf, True, 2, 1e-6, n)

                def refill():
                    new_v, _, new_d = ctx.batch([n] * G, est, torch.float32)
                    static_v.copy_(new_v.to(ctx.device))
                    if static_d is not None:
                        static_d.copy_(new_d.to(ctx.device))
                    return new_v, new_d

                try:
                    _, static_out, (new_v, new_d) = captured_and_replayed(torch, call, refill)
                    variant = (torch.float32, True, (-math.inf, math.inf), 1e-6, 2, 2)
                    want = ctx.want(args_for(ctx, est, new_v, offsets, new_d, variant, None))
                    problem = ctx.compare(static_out, want, torch.float32)
                except Exception as error:
                    problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                rep.check("graphs", f"CUDA-graph capture + replay {name} {est.name} n={n}", problem)
    # zero host syncs with checks off and a size hint
    est = ctx.estimators.get("maxk_loo1")
    values, offsets, _ = ctx.batch([16] * 256, est, torch.float32)
    v, off = values.to(ctx.device), offsets.to(ctx.device)
    backends = ["cuda"] + (["triton"] if ctx.triton is not None else [])
    for backend in backends:
        for layout in ("offsets", "full"):
            def call():
                if layout == "offsets":
                    return ctx.bk.advantages(v, 2, est.name, offsets=off, check_inputs=False, max_group_size=16,
                                             backend=backend)
                return ctx.bk.advantages(v.view(256, 16), 2, est.name, check_inputs=False, max_group_size=16,
                                         backend=backend)
            try:
                # Warm up with the same call: the first call of a layout and bound builds its table
                # bank (one host-to-device copy, documented); the calls after it must not sync.
                call()
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    call()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
                problem = None
            except Exception as error:
                problem = f"synced with the host: {type(error).__name__}: {str(error)[:200]}"
            rep.check("graphs", f"no host sync: bk.advantages(backend={backend}, layout={layout}, checks off, hint)",
                      problem)
    B, T = 64, 40
    logp = torch.randn(B, T, device=ctx.device) * 0.1 - 1
    try:
        torch.cuda.set_sync_debug_mode("error")
        try:
            ctx.bk.policy_loss(logp, logp.detach() + 0.01, torch.rand(B, device=ctx.device), 2, "maxk_loo1",
                               group_size=8, check_inputs=False, backend="triton")
        finally:
            torch.cuda.set_sync_debug_mode(0)
        problem = None
    except Exception as error:
        problem = f"synced with the host: {type(error).__name__}: {str(error)[:200]}"
    rep.check("graphs", "no host sync: bk.policy_loss(backend=triton, checks off, group_size)", problem)


# ----------------------------------------------------------------------------- public API

def section_api(ctx):
    rep = ctx.report
    torch = ctx.torch
    bk = ctx.bk
    backends = ["auto", "torch"] + (["cuda"] if ctx.cuda else ["cpu"]) + (["triton"] if ctx.triton is not None else [])
    names = [n for n in ("maxk", "maxk_loo1", "maxk_offpolicy", "passk", "grpo", "bon_mean", "maxrl")
             if n in bk.ESTIMATORS]
    if "maxrl" not in bk.ESTIMATORS:
        rep.skip("api", "maxrl is not registered in bk.ESTIMATORS")
    G, n = 24, 12
    for name in names:
        est = ctx.estimators.get(name)
        rewards = ctx.rewards(G * n, est, torch.float32).view(G, n)
        deltas = ((torch.rand(G, n, generator=ctx.gen) - 0.5) * 0.4) if est.needs_deltas else None
        lengths = torch.randint(1, n + 1, (G,), generator=ctx.gen)
        group_ids = torch.randperm(G * n, generator=ctx.gen) % G
        k = 1 if name == "maxrl" else 3
        for layout in ("full", "lengths", "offsets", "group_ids"):
            kw = {}
            r, d = rewards, deltas
            if layout == "lengths":
                kw["lengths"] = lengths
            elif layout == "offsets":
                r = rewards.reshape(-1)
                d = None if deltas is None else deltas.reshape(-1)
                kw["offsets"] = torch.arange(G + 1) * n
            elif layout == "group_ids":
                r = rewards.reshape(-1)
                d = None if deltas is None else deltas.reshape(-1)
                kw["group_ids"] = group_ids
            common = dict(deltas=d, clamp_delta=0.3 if est.needs_deltas else None, small_groups="clamp", **kw)
            oracle = "torch"
            if name == "maxrl" and not ctx.reference_has_maxrl():
                oracle = "cpu"  # checked against maxrl_reference by the kernels section
            try:
                want = bk.advantages(r.double(), k, name, backend=oracle, **{key: (val.double() if (
                    key == "deltas" and val is not None) else val) for key, val in common.items()})
            except Exception as error:
                rep.fail("api", f"{name} {layout}: the reference raised {error!r}")
                continue
            for backend in backends:
                label = f"bk.advantages({name}, layout={layout}, backend={backend})"
                try:
                    moved = {key: (val.to(ctx.device) if isinstance(val, torch.Tensor) else val)
                             for key, val in common.items()}
                    got = bk.advantages(r.to(ctx.device), k, name, backend=backend, **moved)
                    ctx.sync()
                    problem = ctx.compare(got.reshape(-1), want.float().double().reshape(-1), torch.float32)
                    if problem is None and got.device.type != ctx.device.type:
                        problem = f"result on {got.device}"
                except Exception as error:
                    problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                rep.check("api", label, problem)
    # pass_at_k / max_at_k on the device
    correct = (torch.rand(G, n, generator=ctx.gen) < 0.3)
    for fn_name in ("pass_at_k", "max_at_k"):
        fn = getattr(bk, fn_name)
        x = correct if fn_name == "pass_at_k" else torch.rand(G, n, generator=ctx.gen)
        try:
            want = fn(x.cpu(), 4).double()
            got = fn(x.to(ctx.device), 4)
            problem = ctx.compare(got.reshape(-1).double(), want.reshape(-1), torch.float64 if got.dtype == torch.float64
                                  else torch.float32)
        except Exception as error:
            problem = f"raised {type(error).__name__}: {str(error)[:300]}"
        rep.check("api", f"bk.{fn_name} on {ctx.device.type}", problem)
    # undersized hint with checks on: a clear error
    try:
        bk.advantages(torch.rand(4, 16, device=ctx.device), 2, "maxk", max_group_size=8, check_inputs=True)
        rep.fail("api", "an undersized max_group_size with checks on did not raise")
    except ValueError:
        rep.ok("api")
    except Exception as error:
        rep.fail("api", f"undersized max_group_size with checks on raised {type(error).__name__}, not ValueError")
    # mixtures over k
    if "k_weights" not in inspect.signature(bk.advantages).parameters:
        rep.skip("api", "mixtures: bk.advantages has no k_weights parameter")
        return
    weights = [0.5, 0.0, 0.3, 0.2]
    for name in ("maxk", "maxk_loo", "maxk_loo1", "passk", "maxk_offpolicy"):
        est = ctx.estimators.get(name)
        rewards = ctx.rewards(G * n, est, torch.float32).view(G, n)
        deltas = ((torch.rand(G, n, generator=ctx.gen) - 0.5) * 0.4) if est.needs_deltas else None
        common = dict(k_weights=weights, small_groups="clamp", clamp_delta=0.3 if est.needs_deltas else None)
        try:
            want = bk.advantages(rewards.double(), estimator=name, backend="torch",
                                 deltas=None if deltas is None else deltas.double(), **common)
        except Exception as error:
            rep.fail("api", f"mixture {name}: the reference raised {error!r}")
            continue
        for backend in backends:
            try:
                got = bk.advantages(rewards.to(ctx.device), estimator=name, backend=backend,
                                    deltas=None if deltas is None else deltas.to(ctx.device), **common)
                ctx.sync()
                problem = ctx.compare(got.reshape(-1), want.float().double().reshape(-1), torch.float32)
            except Exception as error:
                problem = f"raised {type(error).__name__}: {str(error)[:300]}"
            rep.check("api", f"mixture k_weights={weights} {name} backend={backend}", problem)


# ----------------------------------------------------------------------------- policy loss

def section_plans(ctx):
    """bk.prepare_advantages on each backend: every call equals bk.advantages with checks off, bit
    for bit (the first call and the next ones: a Triton plan launches its compiled kernel directly
    from its second call), and the float64 reference; on a GPU also on a side stream and replayed
    from a CUDA graph."""
    rep = ctx.report
    torch = ctx.torch
    bk = ctx.bk

    backends = (["cuda"] if ctx.cuda else ["cpu"]) + (["triton"] if ctx.triton is not None else [])
    dtypes = (torch.float32, torch.bfloat16) if ctx.quick else (torch.float32, torch.bfloat16, torch.float64)
    # (9,000 groups: at n <= 16 a Triton launch of that many takes the thread-per-group layout)
    ns, Gs = ((5, 16), (1, 37)) if ctx.quick else ((5, 16, 64), (1, 37, 1000, 9000))
    for backend in backends:
        for name in ("maxk_loo1", "maxk_offpolicy", "grpo", "maxk", "maxrl"):
            est = ctx.estimators.get(name)
            for dtype in dtypes:
                for n in ns:
                    options = dict(clamp_delta=0.25 if est.needs_deltas else None, backend=backend)
                    for k_weights in ((None, bk.maxrl_weights(n)) if name == "maxk_loo1" else (None,)):
                        k = None if k_weights is not None else 2
                        what = f"plan {backend} {name} {str(dtype)[6:]} n={n}{' k_weights' if k_weights else ''}"
                        try:
                            plan = bk.prepare_advantages(k, name, group_size=n, k_weights=k_weights,
                                                         dtype=dtype, device=ctx.device, **options)
                            problem = None
                            for G in Gs:
                                values, offsets, deltas = ctx.batch([n] * G, est, dtype)
                                r, d = ctx.dev(values).view(G, n), ctx.dev(deltas)
                                d = None if d is None else d.view(G, n)
                                same = bk.advantages(r, k, name, deltas=d, k_weights=k_weights, check_inputs=False,
                                                     max_group_size=n, **options)
                                for call in range(3):
                                    got = plan(r, d)
                                    if not torch.equal(got, same):
                                        problem = f"G={G} call {call}: differs from bk.advantages"
                                        break
                                if problem is None and k_weights is None:
                                    problem = ctx.compare(got.reshape(-1), ctx.want(
                                        args_for(ctx, est, values, offsets, deltas,
                                                 (dtype, True, (-math.inf, math.inf), 1e-6, 2, 2), n)), dtype)
                                if problem is not None:
                                    problem = f"G={G}: {problem}"
                                    break
                            if problem is None and ctx.cuda:
                                problem = _plan_on_streams_and_graphs(ctx, plan, est, n, dtype)
                            if problem is None and backend == "triton" and ctx.cuda and not plan._run.launch.direct_launches:
                                problem = "the Triton plan never launched its compiled kernel directly"
                            if (problem is None and backend == "triton" and ctx.cuda
                                    and not plan._run.launch.specialised_launches):
                                problem = "the Triton plan's launches never ran the estimator's kernel"
                        except Exception as error:
                            problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                        rep.check("plans", what, problem)


def _plan_on_streams_and_graphs(ctx, plan, est, n, dtype):
    """A plan's call on a side stream, then captured in a CUDA graph and replayed on new inputs."""
    torch = ctx.torch
    G = 300
    values, _, deltas = ctx.batch([n] * G, est, dtype)
    static_r = ctx.dev(values).view(G, n)
    static_d = None if deltas is None else ctx.dev(deltas).view(G, n)
    on_default_stream = plan(static_r, static_d)

    def refill():
        new_values, _, new_deltas = ctx.batch([n] * G, est, dtype)
        static_r.copy_(ctx.dev(new_values).view(G, n))
        if static_d is not None:
            static_d.copy_(ctx.dev(new_deltas).view(G, n))

    on_side_stream, static_out, _ = captured_and_replayed(torch, lambda: plan(static_r, static_d), refill)
    if not torch.equal(on_side_stream, on_default_stream):
        return "a side stream's call differs"
    if not torch.equal(static_out, plan(static_r, static_d)):
        return "a CUDA graph's replay differs from a call on the same inputs"
    return None


def section_policy_loss(ctx):
    rep = ctx.report
    torch = ctx.torch
    if ctx.triton is None:
        if ctx.cuda:
            rep.fail("policy_loss", "Triton not usable on CUDA")
        else:
            rep.skip("policy_loss", "no CUDA device and the Triton interpreter is off")
        return
    shapes = ((16, 7), (32, 64), (16, 300), (8, 2500)) if not ctx.quick else ((8, 7), (8, 33))
    configs = [dict(weighting="ppo", loss_agg="token_mean"), dict(weighting="ppo", loss_agg="seq_mean_token_sum"),
               dict(weighting="direct", loss_agg="seq_mean_token_mean"),
               dict(weighting="ppo", loss_agg="token_mean", kl=0.05),
               dict(weighting="direct", loss_agg="seq_mean_token_sum", estimator="maxk_offpolicy")]
    for B, T in shapes:
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            for cfg in configs:
                if ctx.out_of_time("policy_loss", f"B={B} T={T} {dtype}"):
                    return
                cfg = dict(cfg)
                est = cfg.pop("estimator", "maxk_loo1")
                kl = cfg.pop("kl", 0.0)
                logp0 = (torch.randn(B, T, generator=ctx.gen) * 0.3 - 1.0).to(dtype)
                old = (logp0.double() + torch.randn(B, T, generator=ctx.gen, dtype=torch.float64) * 0.05).to(dtype)
                ref = (logp0.double() + torch.randn(B, T, generator=ctx.gen, dtype=torch.float64) * 0.05).to(dtype)
                mask = torch.rand(B, T, generator=ctx.gen) < 0.8
                rewards = torch.rand(B, generator=ctx.gen)
                extra = dict(k=2, estimator=est, group_size=4, mask=mask, kl_coef=kl,
                             ref_logp=ref if kl else None, clamp_delta=0.5 if est == "maxk_offpolicy" else None, **cfg)
                label = f"policy_loss B={B} T={T} {str(dtype)[6:]} {est} {cfg} kl={kl}"
                try:
                    lw = logp0.double().clone().requires_grad_(True)
                    want, _ = ctx.bk.policy_loss(lw, old.double(), rewards.double(), backend="torch",
                                                 **{**extra, "mask": mask, "ref_logp": None if not kl else ref.double()})
                    want.backward()
                    lg = logp0.to(ctx.device).clone().requires_grad_(True)
                    got, _ = ctx.bk.policy_loss(lg, old.to(ctx.device), rewards.to(ctx.device), backend="triton",
                                                **{**extra, "mask": mask.to(ctx.device),
                                                   "ref_logp": None if not kl else ref.to(ctx.device)})
                    got.backward()
                    ctx.sync()
                    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2}[dtype]
                    gl, wl = float(got.detach().double().cpu()), float(want.detach())
                    problem = None
                    if not abs(gl - wl) <= tol * (1 + abs(wl)):
                        problem = f"loss {gl!r} vs {wl!r}"
                    gg, wg = lg.grad.double().cpu(), lw.grad
                    if problem is None and not torch.allclose(gg, wg, rtol=tol * 10, atol=tol * float(wg.abs().max() + 1e-30)):
                        problem = f"grad max err {float((gg - wg).abs().max()):.3e} (scale {float(wg.abs().max()):.3e})"
                except Exception as error:
                    problem = f"raised {type(error).__name__}: {str(error)[:300]}"
                rep.check("policy_loss", label, problem)


# ----------------------------------------------------------------------------- sanitizer target

def sanitize_target(ctx):
    """Small inputs of every CUDA kernel variant (one launch each), NaN groups, malformed offsets."""
    torch = ctx.torch
    for bound, sizes in (CUDA_BUCKETS if ctx.cuda else QUICK_BUCKETS):
        for name in ("maxk_loo1", "maxk_offpolicy", "grpo"):
            est = ctx.estimators.get(name)
            ragged = list(sizes) + [0, sizes[0]]
            values, offsets, deltas = ctx.batch(ragged, est, torch.float32)
            values[0] = math.nan  # the first group breaks the NaN contract
            args = args_for(ctx, est, values, offsets, deltas, (torch.float32, True, (-1.0, 1.0), 0.0, 2, 2), bound)
            ctx.native.advantages_packed(*args)
    for offs in ([0, 10, 5, 30, 40], [-8, 3, 10, 45, 60]):
        values = torch.rand(40)
        for hint in (8, 32, 256, 4096):
            try:
                ctx.native.advantages_packed(values.to(ctx.device), torch.tensor(offs).to(ctx.device), None, 2, 3,
                                             None, -math.inf, math.inf, True, 2, 1e-6, hint)
            except ValueError:
                if ctx.cuda:
                    raise
                pass  # the CPU kernel refuses malformed offsets (its bounds check)
    ctx.sync()
    log("[sanitize-target] done")


# ----------------------------------------------------------------------------- timing

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


def section_timing(ctx):
    torch = ctx.torch
    device = ctx.device
    cells = ([(1024, 16), (65536, 16), (1 << 20, 16), (1 << 18, 64), (4096, 300), (4096, 4096)] if ctx.cuda
             else [(1024, 16), (64, 1024)])
    if ctx.quick:
        cells = [(256, 16), (64, 256)]
    rows = []
    for name in ("maxk_loo1", "maxk_offpolicy", "grpo"):
        est = ctx.estimators.get(name)
        for G, n in cells:
            N = G * n
            values = torch.rand(N, generator=ctx.gen).to(device)
            offsets = (torch.arange(G + 1, dtype=torch.int64) * n).to(device)
            deltas = ((torch.rand(N, generator=ctx.gen) - 0.5) * 0.2).to(device) if est.needs_deltas else None
            args = (values, offsets, deltas, 4, est.code, 0.2 if deltas is not None else None, -math.inf, math.inf,
                    True, 2, 1e-6, n)
            out = torch.empty_like(values)
            row = {"estimator": name, "G": G, "n": n}
            row["native"] = time_calls(lambda: ctx.native.advantages_packed(*args, out=out), device)
            if ctx.triton is not None and ctx.cuda:
                row["triton"] = time_calls(lambda: ctx.triton(*args), device)
            nbytes = values.numel() * values.element_size() * (3 if deltas is not None else 2)
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            row["copy"] = time_calls(lambda: dst.copy_(src), device)
            rows.append(row)
    log(f"{'estimator':15s} {'G':>8s} {'n':>5s} {'native':>10s} {'triton':>10s} {'copy':>10s}")
    for r in rows:
        us = lambda key: f"{r[key] * 1e6:9.1f}u" if key in r else f"{'-':>10s}"  # noqa: E731
        log(f"{r['estimator']:15s} {r['G']:8d} {r['n']:5d} {us('native')} {us('triton')} {us('copy')}")
    ctx.report.sections.setdefault("timing", {"passed": 0, "failed": [], "skipped": []})["rows"] = rows


SECTION_FUNCS = {"kernels": section_kernels, "triton": section_triton,
                 "adversarial-native": lambda ctx: adversarial(ctx, "native"),
                 "adversarial-triton": lambda ctx: adversarial(ctx, "triton"),
                 "streams": section_streams, "graphs": section_graphs, "api": section_api,
                 "plans": section_plans, "policy_loss": section_policy_loss, "timing": section_timing}


def child(args) -> int:
    """Runs the given sections in this interpreter; writes the report as JSON."""
    sys.path.insert(0, os.environ.get("BK_GPU_CHECK_PACKAGE_ROOT", ROOT))
    import torch
    from bonkernels import _native
    report = Report(args.json)
    route = _native.build_route()
    log(f"[env] python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}), "
        f"device {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
        + f"; bonkernels from {os.path.dirname(_native.__file__)}; extension build route: {route}")
    if not _native.available():
        report.fail("build", f"the extension did not load: {_native.load_error()}")
    elif args.device == "cuda" and route != args.route:
        report.fail("build", f"expected the {args.route} build route, the loaded extension reports {route}")
    elif args.device == "cuda" and not _native.cuda_available():
        report.fail("build", "the extension has no usable CUDA kernels")
    else:
        report.ok("build")
    if report.sections["build"]["failed"]:
        json.dump(report.sections, open(args.json, "w"), indent=1)
        return 1
    ctx = Ctx(args.device, args.quick, report, args.budget_s)
    if args.sanitize_target:
        sanitize_target(ctx)
        return 0
    for name in args.sections.split(","):
        t0 = time.monotonic()
        try:
            SECTION_FUNCS[name](ctx)
        except Exception:
            report.fail(name, "section crashed:\n" + traceback.format_exc())
        s = report.sections.setdefault(name, {"passed": 0, "failed": [], "skipped": []})
        log(f"[{name}] {s['passed']} passed, {len(s['failed'])} failed, {len(s['skipped'])} skipped "
            f"in {time.monotonic() - t0:.0f} s")
        report.flush()
    json.dump(report.sections, open(args.json, "w"), indent=1, default=str)
    return 0 if not any(s["failed"] for s in report.sections.values()) else 1


# ============================================================================= parent

class Job:
    """A child interpreter running some sections (or the sanitizer target), its output in a file."""

    def __init__(self, args, name, scratch, sections=(), env_extra=None, sanitize=False, prefix=(), route=None,
                 package_root=None, budget_s=1e9):
        self.name, self.sanitize = name, sanitize
        self.json = os.path.join(scratch, f"{name}.json")
        self.log_path = os.path.join(scratch, f"{name}.log")
        cmd = [*prefix, sys.executable, os.path.abspath(__file__), "--child", "--device", args.device, "--route",
               route or args.route, "--json", self.json, "--sections", ",".join(sections),
               "--budget-s", str(budget_s)]
        if args.quick:
            cmd.append("--quick")
        if sanitize:
            cmd.append("--sanitize-target")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
        env.setdefault("OMP_NUM_THREADS", "4")  # several children share the CPU
        if package_root:
            env["BK_GPU_CHECK_PACKAGE_ROOT"] = package_root
        self.file = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.file, stderr=subprocess.STDOUT)
        self.rc = "running"

    def wait(self, deadline_s):
        try:
            self.rc = self.proc.wait(timeout=max(1.0, deadline_s - elapsed()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.rc = None
        self.file.close()
        return self.rc

    def output(self):
        return open(self.log_path, errors="replace").read()


def find_sanitizer() -> str | None:
    cand = [shutil.which("compute-sanitizer")]
    home = resolve_cuda_home()
    if home:
        cand += [os.path.join(home, "bin", "compute-sanitizer"), os.path.join(home, "compute-sanitizer",
                                                                              "compute-sanitizer")]
    cand += ["/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer"]
    for c in cand:
        if c and os.path.exists(c):
            return c
    return None


def main() -> int:
    global LOG_FILE, TRITON_CACHE_FILL
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "build", "gpu_check"),
                        help="directory for gpu_check.log and summary.json (default: $OUT or build/gpu_check)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--dry-run", action="store_true",
                        help="--device cpu, tiny sizes, no build, Triton under its interpreter (what CI runs)")
    parser.add_argument("--no-build", action="store_true", help="use the extension as it is")
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--route", choices=("torch-cuda", "bare-nvcc"), default="torch-cuda",
                        help="the build route to build and assert (default torch-cuda)")
    parser.add_argument("--no-bare-route", action="store_true", help="skip the extra bare-nvcc build and checks")
    parser.add_argument("--deadline-s", type=float, default=420,
                        help="whole-script budget (checks past it FAIL; one H200 took 245 s without the "
                             "bare-nvcc route)")
    parser.add_argument("--only", default=None,
                        help="comma-separated sections to run, e.g. plans,graphs (default: all; the "
                             "sanitizer and timing jobs only when named)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sanitize-target", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sections", default=",".join(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, default=1e9, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.no_build, args.quick = "cpu", True, True
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        args.no_build = True  # the CPU kernel: checked as built (the CUDA build is the GPU machine's job)
    if args.child:
        return child(args)

    os.makedirs(args.out, exist_ok=True)
    LOG_FILE = open(os.path.join(args.out, "gpu_check.log"), "w")
    summary = {"device": args.device, "route": args.route if args.device == "cuda" else None, "argv": sys.argv[1:],
               "sections": {}, "notes": []}
    failed: list[str] = []
    scratch = tempfile.mkdtemp(prefix="bk_gpu_check_")
    cuda = args.device == "cuda"
    log(f"[gpu_check] device {args.device}; log and summary.json in {args.out}")
    if cuda:
        TRITON_CACHE_FILL = start_triton_cache_fill(args.out)

    # 1. the build, by the asserted route: a failure fails the check (no silent fallback)
    if not args.no_build:
        if not build(args.route, 200):
            failed.append(f"build by the {args.route} route failed")
            summary["sections"]["build"] = {"passed": 0, "failed": [f"{args.route} build failed"], "skipped": []}
            return finish(args, summary, failed)
    elif cuda:
        log("[build] --no-build: checking the extension as it is")

    # 2. the checks: each group of sections in its own interpreter, all at once (one crashed CUDA
    # context loses one group; the GPU is shared, correctness is not affected)
    env_extra = {"TRITON_INTERPRET": "1"} if (not cuda and args.dry_run) else {}
    groups = [("core", ["kernels", "streams", "graphs", "api", "plans"], env_extra),
              ("policy_loss", ["policy_loss"], env_extra), ("adversarial-native", ["adversarial-native"], env_extra)]
    shards = TRITON_SHARDS if (cuda and not args.quick) else 2  # 2: the dry run covers the sharding too
    for i in range(shards):
        shard_env = dict(env_extra, BK_GPU_CHECK_SHARD=f"{i}/{shards}")
        groups += [(f"triton-{i}", ["triton"], shard_env), (f"adversarial-triton-{i}", ["adversarial-triton"], shard_env)]
    only = None if args.only is None else {name for name in args.only.split(",") if name}
    if only is not None:
        unknown = only - set(SECTIONS) - {"sanitizer", "timing"}
        if unknown:
            log(f"[gpu_check] --only: unknown sections {sorted(unknown)} (known: {', '.join(SECTIONS)}, "
                "sanitizer, timing)")
            stop_triton_cache_fill(TRITON_CACHE_FILL)
            return 2
        groups = [(name, [s for s in sections if s in only], env) for name, sections, env in groups]
        groups = [group for group in groups if group[1]]
        summary["notes"].append(f"--only {args.only}: the other sections did not run")
    check_deadline = args.deadline_s - 30  # leave time for the timing table and the summary
    budget = check_deadline - elapsed() - 20  # children stop themselves (and say so) before being killed
    jobs = [Job(args, name, scratch, sections, env, budget_s=budget) for name, sections, env in groups]
    # 3. compute-sanitizer on every CUDA kernel variant, alongside
    sanitizer = find_sanitizer() if cuda else None
    sec = summary["sections"].setdefault("sanitizer", {"passed": 0, "failed": [], "skipped": []})
    if only is not None and "sanitizer" not in only:
        sec["skipped"].append("not named in --only")
    elif not cuda:
        jobs.append(Job(args, "sanitize-plain", scratch, env_extra=env_extra, sanitize=True))
        sec["skipped"].append("no CUDA device: the sanitizer target ran without compute-sanitizer")
    elif sanitizer is None:
        sec["skipped"].append("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda)")
    else:
        for tool in ("memcheck", "racecheck", "synccheck"):
            prefix = (sanitizer, "--tool", tool, "--error-exitcode", "97", "--print-limit", "20")
            jobs.append(Job(args, f"sanitize-{tool}", scratch, sanitize=True, prefix=prefix,
                            env_extra={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}))
    # 4. the bare-nvcc route too, built meanwhile into a scratch package (streams and graphs are its risk)
    bare_pkg = None
    if cuda and not args.no_build and not args.no_bare_route and args.route == "torch-cuda":
        bare_pkg = os.path.join(scratch, "bare")
        shutil.copytree(os.path.join(ROOT, "bonkernels"), os.path.join(bare_pkg, "bonkernels"),
                        ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
        if build("bare-nvcc", max(30.0, args.deadline_s - elapsed() - 90), build_lib=bare_pkg):
            jobs.append(Job(args, "bare-nvcc", scratch, ["streams", "graphs"], route="bare-nvcc",
                            package_root=bare_pkg, budget_s=check_deadline - elapsed() - 15))
        else:
            failed.append("bare-nvcc build failed")

    for job in jobs:
        rc = job.wait(check_deadline)
        out = job.output()
        log(f"---------------- {job.name} ({'timed out' if rc is None else f'exit {rc}'})")
        for line in out.splitlines()[-400:]:
            log(line)
        data = json.load(open(job.json)) if os.path.exists(job.json) else {}
        if job.sanitize:
            if not cuda:
                if rc != 0 or "[sanitize-target] done" not in out:
                    sec["failed"].append(f"sanitizer target failed (exit {rc})")
            elif rc == 0 and "[sanitize-target] done" in out and (
                    "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards displayed (0 errors" in out):
                sec["passed"] += 1
            else:
                sec["failed"].append(f"{job.name}: " + ("timed out" if rc is None else f"exit {rc}, errors in the log"))
            continue
        prefix_name = "bare-nvcc:" if job.name == "bare-nvcc" else ""
        for name, s in data.items():
            target = summary["sections"].setdefault(prefix_name + name, {"passed": 0, "failed": [], "skipped": []})
            target["passed"] += s["passed"]
            target["failed"] += s["failed"]
            target["skipped"] += s["skipped"]
        if rc != 0 and (rc is None or not any(s["failed"] for s in data.values())):
            failed.append(f"{job.name}: " + ("timed out (not every check ran)" if rc is None else f"exit status {rc}"))

    # 5. timing (informational; a crash still fails)
    if only is not None and "timing" not in only:
        pass
    elif args.deadline_s - elapsed() > 15:
        job = Job(args, "timing", scratch, ["timing"], env_extra)
        rc = job.wait(args.deadline_s - 2)
        for line in job.output().splitlines():
            log(line)
        if rc != 0:
            failed.append("timing: " + ("timed out" if rc is None else f"exit status {rc}"))
    else:
        summary["notes"].append("timing skipped: out of time")
        log("[time] skipped: out of time")
    return finish(args, summary, failed)


def triton_cache_fill_commands(arch: int) -> list[list[str]]:
    """The ahead-of-time compiles of the kernels the Triton sections launch: every estimator's at
    float32, the TRITON_EVERY_DTYPE ones at the other dtypes, both layouts, every block."""
    base = [sys.executable, "-m", "bonkernels.triton.aot", "--arch", str(arch), "--estimators",
            "--jobs", str(TRITON_CACHE_FILL_JOBS)]
    return [base + ["--dtype", "fp32"], base + ["--dtype", "fp64", "fp16", "bf16", "--only", *TRITON_EVERY_DTYPE]]


def start_triton_cache_fill(out_dir: str):
    """On a GPU a Triton launch compiles its kernel for the call's estimator on first use (1-5 s
    each, about 600 kernels in the Triton sections): compile them ahead in TRITON_CACHE_FILL_JOBS
    processes, beside the build, into Triton's on-disk cache, which the sections' launches then read. Returns the
    process (stop_triton_cache_fill ends it), or None when no GPU arch is known."""
    import shlex

    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        major, minor = query.stdout.split()[0].split(".")
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        log("[triton cache] no GPU arch from nvidia-smi: the sections compile their own kernels")
        return None
    script = " && ".join(shlex.join(cmd) for cmd in triton_cache_fill_commands(int(major) * 10 + int(minor)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with open(os.path.join(out_dir, "triton_cache_fill.txt"), "w") as out:
        process = subprocess.Popen(["bash", "-c", script], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    log(f"[triton cache] filling in {TRITON_CACHE_FILL_JOBS} processes (sm_{major}{minor}; "
        "triton_cache_fill.txt)")
    return process


def stop_triton_cache_fill(process) -> None:
    if process is None:
        return
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()
        log("[triton cache] stopped before it finished (the sections compiled the rest)")
    else:
        log(f"[triton cache] done (exit {process.returncode})")


def finish(args, summary, failed) -> int:
    stop_triton_cache_fill(TRITON_CACHE_FILL)
    total_failed = sum(len(s["failed"]) for s in summary["sections"].values())
    total_passed = sum(s["passed"] for s in summary["sections"].values())
    summary["failures_outside_sections"] = failed
    summary["passed"], summary["failed"] = total_passed, total_failed
    summary["elapsed_s"] = round(elapsed(), 1)
    ok = total_failed == 0 and not failed
    summary["ok"] = ok
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    log("")
    log(f"{'section':28s} {'passed':>7s} {'failed':>7s} {'skipped':>8s}")
    for name, s in summary["sections"].items():
        log(f"{name:28s} {s['passed']:7d} {len(s['failed']):7d} {len(s['skipped']):8d}")
    for name, s in summary["sections"].items():
        for reason in s["skipped"]:
            log(f"skipped [{name}]: {reason}")
        for msg in s["failed"][:10]:
            log(f"FAIL [{name}]: {msg[:240]}")
        if len(s["failed"]) > 10:
            log(f"FAIL [{name}]: ... and {len(s['failed']) - 10} more (summary.json)")
    for msg in failed:
        log(f"FAILED: {msg}")
    log(f"[done] route asserted: {args.route if args.device == 'cuda' else 'n/a (cpu)'}; "
        f"{'OK' if ok else 'FAILED'}: {total_passed} passed, {total_failed} failed, in {elapsed():.0f} s; "
        f"log and summary.json in {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
