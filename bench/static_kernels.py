"""Static proxies of the GPU kernels for sm_90 (no GPU needed): resources, SASS counts, and an
issue-time versus memory-time estimate for an H200.

    python -m bench.static_kernels                 # CUDA (all variants) + Triton (fp32); writes
                                                   # bench/results/static_sm90/
    python -m bench.static_kernels --no-triton     # CUDA only (about 10 min on 2 cores)
    python -m bench.static_kernels --quick --out D # one small build and variant (the test's mode)
    python -m bench.static_kernels --source-rev REV --no-triton --out D
                                                   # the CUDA kernels of another git revision

CUDA: csrc/cuda/advantages.cu is compiled with bare nvcc to an sm_90 cubin with the flags of
setup.py's bare-nvcc route (-O3 -std=c++17 --expt-relaxed-constexpr --split-compile=0
--threads=0). Builds:
  * ``default``: exactly what ships (every estimator and dtype behind run-time switches);
  * ``<estimator>/fp32``: -DBK_STATIC_ESTIMATOR_CODE=<code> -DBK_STATIC_FP32 (opt-in macros of
    advantages.cu; never set by a real build): one estimator, float32, so the compiler drops
    every other branch and the SASS is close to that estimator's path. The path is the one a
    single-k call on [G, n] rewards takes: -DBK_STATIC_FULL_GROUPS (groups fill the small-group
    kernel's slots) and, for the estimators linear in their tables, -DBK_STATIC_BANKED (the host
    passes one k's table bank; bonkernels/tables.py single_k_bank). A revision without those
    macros (--source-rev) builds without them: its kernels computed the tables in the kernel.
Registers, stack, local (spill) memory and static shared memory come from ``cuobjdump -res-usage``
(spill bytes from ``ptxas -v``), SASS from ``cuobjdump -sass``.

Triton: bonkernels/triton/aot.py's compile path (fp32, the blocks that cover n in
{8, 16, 32, 64, 1024, 4096}): build ``fp32`` is the kernel with every estimator (code at run
time: the spread layout of small batches and torch.compile's launches); ``<estimator>/fp32``
makes the estimator's facts and has_bank (1 for the estimators that read one k's bank in a
single-k call) compile-time constants (bonkernels/triton/_sources.py): at BLOCK <= 16 the lane
kernel a GPU launch of that call runs, at larger blocks an analysis-only build.
Registers and spills from ``ptxas -v`` on its PTX, shared memory from the compiled metadata, SASS
from its cubin.

How SASS is counted (per thread: one warp-instruction is issued for each instruction a warp runs):
  * ``main``: the function's code up to its out-of-line slow paths. nvcc puts, after the last
    EXIT, a WARPSYNC.COLLECTIVE stub for every shuffle it cannot prove convergent; a converged warp
    never runs them (they are counted apart, ``cold``). Trailing NOP padding is dropped.
  * loops: a backward branch inside ``main`` closes a loop. The block kernels' radix-sort pass loop
    (the loop holding the BAR.SYNCs: cub::BlockRadixSort over 64-bit keys, 4 bits a pass) is
    weighted by its 16 passes, or 9 in the float32 builds once the sort skips the 29 low bits a
    widened float32 leaves constant (radix_passes); every other loop (the NaN fill of malformed groups: error path;
    ipow: bon_rlb only) counts once, as do straight-line instructions. The shared-memory tile
    copies are unrolled rounds (straight-line, every round counted); revisions before them ran the
    copies as loops, which this count undercounts (about 5-22 instructions per sample).
  * ``path``: the longest entry-to-exit path through main's control-flow graph (back edges
    removed, loop bodies weighted as above; branches into the cold stubs not followed). This is
    what the estimate uses: an upper bound on the instructions one thread (one warp) issues when
    nothing diverges, as it is a static bound and not a trace (the longest arm of every branch the
    compiler kept: too-small groups, the NaN contract, rare rescaling in divisions, the k >= 2 arm
    of maxk_loo1). Most of the kernels' branches are predicated, so it lies within ~10 % of the
    weighted count. The shipped builds (CUDA ``default``, Triton ``fp32``) dispatch through jump
    tables (BRX: every estimator, and dtype), where the graph is unknown: their ``path`` is the
    weighted count of everything, a loose bound kept only to compare builds.

The estimate (H200, N = 16M samples, groups of n):
  * warp-instructions per sample = per-thread count x threads per group / n / 32 (small-group
    kernel: 1 thread per group; segment kernel: P lanes per group; sub-warp kernel (older
    revisions): W lanes per group; block kernel: BLOCK threads per group; Triton: num_warps x 32
    threads per GROUPS groups);
  * issue time = warp-instructions / (132 SMs x 4 schedulers x 1 warp-instruction per clock x
    1.98 GHz); dual issue is ignored (Hopper issues one per scheduler per clock);
  * pipe bounds, taken when larger: FP64 (DADD/DMUL/DFMA/DSETP/DMNMX and F64 conversions) at 64
    lanes/clk/SM (2 warp-instructions/clk/SM), SHFL at 32 lanes/clk/SM (1/clk/SM), MUFU at 16
    lanes/clk/SM (0.5/clk/SM), and, since 2026-12-03, the two integer pipes of 16 lanes per
    scheduler: ALU (compares, selects, integer min/max, logic, shifts, LEA, IADD3, predicate logic;
    ALU_OPS) and IMAD (the heavy FMA pipe), 64 lanes/clk/SM each; the estimate is the largest of
    the six. A sort network's exchanges are ALU work, so this bound is the binding one for the
    small-group kernels; the issue bound alone (``issue / memory``) is kept next to it, as the
    figure the earlier tables report;
  * memory time = bytes per sample x N / 4.3e12 B/s, bytes per sample = values read + output
    written (+ deltas read, off-policy) in the element type, + 8 / n for the int64 offsets;
  * ratio = estimate / memory time: above 1 the kernel cannot reach the memory limit (issue-bound).
Latency, occupancy limits on latency hiding, and L2 traffic (the re-reads after the sort hit L2)
are not modelled.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bonkernels import estimators  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)

# ---------------------------------------------------------------------------------------------- H200
SMS = 132
SCHEDULERS = 4  # warp-instructions issued per clock per SM
CLOCK_HZ = 1.98e9
FP64_WARP_PER_CLK = 2.0  # 64 FP64 lanes/clk/SM
SHFL_WARP_PER_CLK = 1.0  # 32 lanes/clk/SM
MUFU_WARP_PER_CLK = 0.5  # 16 lanes/clk/SM
# 16 lanes per scheduler on sm_90: the ALU pipe (integer except IMAD/IMUL, logic, compares, selects,
# min/max, shifts, LEA, predicate logic, moves) and the heavy FMA pipe, the only one that takes IMAD.
ALU_WARP_PER_CLK = 2.0  # 64 lanes/clk/SM
IMAD_WARP_PER_CLK = 2.0  # 64 lanes/clk/SM
ALU_OPS = {"ISETP", "FSETP", "PSETP", "SEL", "FSEL", "LOP3", "LOP", "PLOP3", "IADD3", "IADD", "VIMNMX", "IMNMX",
           "FMNMX", "LEA", "SHF", "SHL", "SHR", "PRMT", "P2R", "R2P", "IABS", "FLO", "POPC", "BMSK", "SGXT", "BREV",
           "MOV", "ISCADD", "VIADD", "VIADDMNMX"}
HBM_BPS = 4.3e12
N_SAMPLES = 1 << 24
NS = (8, 16, 32, 64, 128, 512, 1024, 4096)
# sm_90 occupancy limits
REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
WARPS_PER_SM = 64
REG_ALLOC_UNIT = 256  # registers per warp are allocated in units of 256

RADIX_PASSES = 16  # cub::BlockRadixSort of 64-bit keys, RADIX_BITS = 4
# Since the block kernels sort only the key bits a float32 reward can set (advantages.cu,
# kRadixBeginBitNarrow = 29): 35 bits, 9 passes, in the float32 builds of such a source.
RADIX_PASSES_NARROW = 9
ESTIMATORS = ("maxk_loo1", "maxk_offpolicy", "grpo")
ELEM_BYTES = {"fp32": 4, "fp64": 8, "fp16": 2, "bf16": 2}
TRITON_BLOCKS = (8, 16, 32, 64, 1024, 4096)


def radix_passes(build: str, source: str, block_threads: int = 0) -> int:
    """Passes of the block sort in a build: 9 for float32 builds of a source with the narrow sort,
    in the blocks it applies to (kRadixNarrowMaxBlock in advantages.cu), else 16."""
    narrow = build.endswith("/fp32") and "kRadixBeginBitNarrow" in source
    m = re.search(r"kRadixNarrowMaxBlock = (\d+)", source)
    if narrow and m and block_threads > int(m.group(1)):
        narrow = False
    return RADIX_PASSES_NARROW if narrow else RADIX_PASSES


# ---------------------------------------------------------------------------------------------- variants

@dataclass(frozen=True)
class CudaVariant:
    name: str
    pattern: str  # a regular expression found in the mangled name
    block_threads: int  # threads per block
    group_threads: int  # threads per group
    n_lo: int  # the launcher picks it for n_lo <= max_group_size <= n_hi
    n_hi: int
    dynamic_smem: int = 0  # bytes of dynamic shared memory the launcher gives it (occupancy)


# Every kernel shape bk_cuda_advantages has launched, in the launcher's order of preference: the
# small-group (one thread per group) and segment (P lanes per group) kernels of the size-bucketed
# launcher, and the sub-warp and small-block kernels they replaced (kept to read older revisions,
# --source-rev). A build is reported with the variants its cubin holds. The small-group kernel is
# instantiated per set of calls (group_math.h's LaneCalls: kAll 0, kOnPolicy 1, kWide 2, kCentred 3,
# kWideOffPolicy 4): "offwide" (kWideOffPolicy: maxk_offpolicy from a bank on float32 rewards, since
# 2026-12-06), "off" (kAll, which the launcher sends the other off-policy calls; older revisions:
# template argument true), "centred" (kCentred: grpo, rloo, dr_grpo and maxrl on float32 rewards),
# "wide" (kWide at W = 8 and 16: maxk, passk and maxk_loo1 from a bank on float32 rewards) and the
# plain name for the others (kOnPolicy, or kWide at W = 32 and 64; older revisions: false, or one
# kernel for all). The segment kernel likewise: "centred", "wide", "offwide" and the plain name for kAll
# (older revisions: one kernel for all).
CUDA_VARIANTS = (
    CudaVariant("thread_kernel<8,offwide>", "thread_kernelILi8ELNS_9LaneCallsE4EE", 128, 1, 1, 8),
    CudaVariant("thread_kernel<16,offwide>", "thread_kernelILi16ELNS_9LaneCallsE4EE", 128, 1, 9, 16),
    CudaVariant("thread_kernel<8,off>", "thread_kernelILi8E(Lb1E|LNS_9LaneCallsE0E)E", 128, 1, 1, 8),
    CudaVariant("thread_kernel<16,off>", "thread_kernelILi16E(Lb1E|LNS_9LaneCallsE0E)E", 128, 1, 9, 16),
    CudaVariant("thread_kernel<8,centred>", "thread_kernelILi8ELNS_9LaneCallsE3EE", 128, 1, 1, 8),
    CudaVariant("thread_kernel<16,centred>", "thread_kernelILi16ELNS_9LaneCallsE3EE", 128, 1, 9, 16),
    CudaVariant("thread_kernel<8,wide>", "thread_kernelILi8ELNS_9LaneCallsE2EE", 128, 1, 1, 8),
    CudaVariant("thread_kernel<16,wide>", "thread_kernelILi16ELNS_9LaneCallsE2EE", 128, 1, 9, 16),
    CudaVariant("thread_kernel<8>", "thread_kernelILi8E(Lb0E|LNS_9LaneCallsE1E)?E", 128, 1, 1, 8),
    CudaVariant("thread_kernel<16>", "thread_kernelILi16E(Lb0E|LNS_9LaneCallsE1E)?E", 128, 1, 9, 16),
    CudaVariant("thread_kernel<32>", "thread_kernelILi32E(Lb0E|LNS_9LaneCallsE2E)?E", 128, 1, 17, 32),
    CudaVariant("thread_kernel<32,offwide>", "thread_kernelILi32ELNS_9LaneCallsE4EE", 128, 1, 17, 32),
    # kWide: the groups of exactly 64 (the segment kernel takes the smaller ones of the launch)
    CudaVariant("thread_kernel<64>", "thread_kernelILi64ELNS_9LaneCallsE2EE", 128, 1, 64, 64),
    # kWideOffPolicy: likewise, with three tiles in dynamic shared memory (kThreadLinesSmemBytes)
    CudaVariant("thread_kernel<64,offwide>", "thread_kernelILi64ELNS_9LaneCallsE4EE", 128, 1, 64, 64,
                dynamic_smem=102400),
    *(CudaVariant(f"segment_kernel<{lanes}{suffix}>", f"segment_kernelILi{lanes}E{calls}E", 128, lanes,
                  lo, hi)
      for lanes, lo, hi in ((2, 17, 32), (4, 33, 64), (8, 65, 128), (16, 129, 256), (32, 257, 512))
      for suffix, calls in ((",centred", "LNS_9LaneCallsE3E"), (",wide", "LNS_9LaneCallsE2E"),
                            (",offwide", "LNS_9LaneCallsE4E"), ("", "(LNS_9LaneCallsE0E)?"))),
    CudaVariant("warp_kernel<8>", "warp_kernelILi8EE", 256, 8, 1, 8),
    CudaVariant("warp_kernel<16>", "warp_kernelILi16EE", 256, 16, 9, 16),
    CudaVariant("warp_kernel<32>", "warp_kernelILi32EE", 256, 32, 17, 32),
    CudaVariant("block_kernel<32,2>", "block_kernelILi32ELi2EE", 32, 32, 33, 64),
    CudaVariant("block_kernel<64,2>", "block_kernelILi64ELi2EE", 64, 64, 65, 128),
    CudaVariant("block_kernel<128,2>", "block_kernelILi128ELi2EE", 128, 128, 33, 256),
    CudaVariant("block_kernel<128,4>", "block_kernelILi128ELi4EE", 128, 128, 257, 512),
    CudaVariant("block_kernel<256,4>", "block_kernelILi256ELi4EE", 256, 256, 513, 1024),
    CudaVariant("block_kernel<256,8>", "block_kernelILi256ELi8EE", 256, 256, 1025, 2048),
    CudaVariant("block_kernel<512,8>", "block_kernelILi512ELi8EE", 512, 512, 2049, 4096),
)


# The estimators of group_math.h's LaneCalls::kWide (grpo, and maxk, passk, maxk_loo1 with their
# bank, which the estimator builds have). The launcher sends those float32 calls to
# thread_kernel<32> and, for groups of exactly 64, thread_kernel<64>, except the ones it sends to
# kCentred first (grpo: its kCentred small-group and segment kernels); every other call, and a
# build for every call ("default"), takes segment_kernel<2> and <4> there.
WIDE_LANE_BUILDS = ("grpo/fp32", "maxk/fp32", "passk/fp32", "maxk_loo1/fp32")
# The float32 calls it sends to the kCentred instantiations of the small-group and segment kernels
# (the registry's centred estimators); the other WIDE_LANE_BUILDS go to their kWide instantiations.
CENTRED_LANE_BUILDS = tuple(f"{e.name}/fp32" for e in estimators.REGISTRY.values() if e.centred)
# The float32 call with deltas that the launcher sends to the kWideOffPolicy instantiations (its
# bank in the estimator build), thread_kernel<32> and (groups of exactly 64) thread_kernel<64> included.
OFF_WIDE_BUILDS = ("maxk_offpolicy/fp32",)


def cuda_variant_for(n: int, present=None, build: str | None = None) -> CudaVariant:
    """The kernel the launcher runs for the groups of a batch with max_group_size = n, among the
    variants ``present`` in a build (default: all), for the call of ``build`` (None: a wide-lane
    call that no centred instantiation takes, such as maxk_loo1). With n > 16 the size-bucketed
    launcher also starts a second kernel (the small-group kernel; at n = 64 for a wide-lane call,
    the segment kernel), which then only reads two offsets per group and skips it: the estimate
    leaves that out."""
    from bonkernels import estimators
    # the estimators with deltas: the launcher sends them to the "off" instantiations
    est = estimators.REGISTRY.get(build.split("/")[0]) if build is not None else None
    off_policy = est is not None and est.needs_deltas
    for v in CUDA_VARIANTS:
        if v.n_lo <= n <= v.n_hi and (present is None or v.name in present):
            wide_call = build in WIDE_LANE_BUILDS and build not in CENTRED_LANE_BUILDS
            if v.name in ("thread_kernel<32>", "thread_kernel<64>") and build is not None and not wide_call:
                continue
            if v.name.endswith(",offwide>") and build not in OFF_WIDE_BUILDS:
                continue
            if v.name.endswith(",off>") and not off_policy:
                continue
            if v.name.endswith(",centred>") and build not in CENTRED_LANE_BUILDS:
                continue
            if v.name.endswith(",wide>") and build is not None and build not in WIDE_LANE_BUILDS:
                continue
            return v
    raise ValueError(f"no CUDA kernel for n = {n}")


# ---------------------------------------------------------------------------------------------- tools

def cuda_home() -> str | None:
    for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/local/cuda-13.0"):
        if cand and os.path.exists(os.path.join(cand, "bin", "nvcc")):
            return cand
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = os.path.realpath(nvcc)
        with open(real, "rb") as f:  # a wrapper script such as /usr/local/bin/nvcc
            head = f.read(200)
        m = re.search(rb"exec (\S+)/bin/nvcc", head)
        return m.group(1).decode() if m else os.path.dirname(os.path.dirname(real))
    return None


def _triton_bin(name: str) -> str | None:
    try:
        import triton
    except ImportError:
        return None
    p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return p if os.path.exists(p) else None


def find_tool(name: str) -> str | None:
    """nvcc, cuobjdump or ptxas: the toolkit's, else PATH's, else the copy bundled with triton."""
    home = cuda_home()
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    return shutil.which(name) or _triton_bin(name)


def have_tools() -> bool:
    return bool(find_tool("nvcc") and find_tool("cuobjdump"))


# ---------------------------------------------------------------------------------------------- SASS

@dataclass
class Instr:
    addr: int
    pred: str
    op: str  # opcode with modifiers, e.g. SHFL.BFLY
    args: str

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """``cuobjdump -sass`` text -> {function name: instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    cur = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if m:
            cur.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return funcs


def _branch_target(ins: Instr) -> int | None:
    if ins.base not in ("BRA",):
        return None
    m = re.search(r"0x([0-9a-f]+)", ins.args)
    return int(m.group(1), 16) if m else None


def split_regions(instrs: list[Instr]) -> tuple[list[Instr], list[Instr]]:
    """(main, cold): cold = the WARPSYNC.COLLECTIVE slow-path stubs after the last EXIT of the main
    code; trailing padding (the final self-branch and NOPs) is dropped from both."""
    end = len(instrs)
    while end > 0 and instrs[end - 1].base == "NOP":
        end -= 1
    if end > 0 and _branch_target(instrs[end - 1]) == instrs[end - 1].addr:
        end -= 1  # BRA to itself: the end-of-function trap
    body = instrs[:end]
    first = next((i for i, x in enumerate(body) if x.op.startswith("WARPSYNC.COLLECTIVE")), None)
    if first is None:
        return body, []
    cut = first
    while cut > 0 and not (body[cut - 1].pred == "" and body[cut - 1].base in ("EXIT", "BRA")):
        cut -= 1
    return body[:cut], body[cut:]


@dataclass
class Loop:
    start: int  # index of the first instruction
    end: int  # index of the backward branch
    bars: int
    trips: int


def find_loops(main: list[Instr], radix_passes: int = RADIX_PASSES) -> list[Loop]:
    """Backward branches inside main; a loop holding BAR.SYNC is a radix-sort pass loop."""
    index = {x.addr: i for i, x in enumerate(main)}
    loops = []
    for i, x in enumerate(main):
        t = _branch_target(x)
        if t is not None and t <= x.addr and t in index:
            s = index[t]
            bars = sum(1 for y in main[s:i + 1] if y.base == "BAR")
            loops.append(Loop(s, i, bars, radix_passes if bars else 1))
    return loops


FP64_OPS = {"DADD", "DMUL", "DFMA", "DSETP", "DMNMX", "DSET"}
CLASSES = ("total", "shfl", "match", "warpsync", "bar", "bssy_bsync", "fp64", "mufu", "ldg", "stg",
           "lds_sts", "branch", "alu", "imad")


def classify(ins: Instr) -> list[str]:
    b = ins.base
    out = ["total"]
    if b == "SHFL":
        out.append("shfl")
    elif b == "MATCH":
        out.append("match")
    elif b == "WARPSYNC":
        out.append("warpsync")
    elif b == "BAR":
        out.append("bar")
    elif b in ("BSSY", "BSYNC"):
        out.append("bssy_bsync")
    elif b in FP64_OPS or (b in ("F2F", "I2F", "F2I") and "F64" in ins.op):
        out.append("fp64")
    elif b == "MUFU":
        out.append("mufu")
    elif b == "LDG":
        out.append("ldg")
    elif b == "STG":
        out.append("stg")
    elif b in ("LDS", "STS"):
        out.append("lds_sts")
    elif b in ALU_OPS:
        out.append("alu")
    elif b == "IMAD":
        out.append("imad")
    if b in ("BRA", "BRX", "JMP", "JMX", "EXIT", "CALL", "RET"):
        out.append("branch")
    return out


def count(instrs: list[Instr], weights: list[int] | None = None) -> dict[str, int]:
    c = dict.fromkeys(CLASSES, 0)
    for i, x in enumerate(instrs):
        w = weights[i] if weights else 1
        for k in classify(x):
            c[k] += w
    return c


@dataclass
class SassCounts:
    static: dict  # main region, each instruction once
    weighted: dict  # main region, loops weighted by their trip counts
    cold: int  # WARPSYNC.COLLECTIVE stubs
    loops: list  # (instructions in the loop, trips)
    path: dict = field(default_factory=dict)  # the longest path through main (loops weighted)


def _is_exit_or_jump(ins: Instr) -> bool:
    return ins.base in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET")


def longest_path(main: list[Instr], weights: list[int]) -> dict:
    """Class counts along the longest entry-to-exit path of main's control-flow graph, back edges
    removed and loop bodies weighted (``weights``). Branches into the cold stubs (BRA.DIV and the
    like: taken only by a diverged warp) are not followed; an indirect branch (BRX) makes the
    graph unknown, and then the weighted count of everything is returned instead."""
    if any(x.base in ("BRX", "JMX", "CALL") for x in main):
        return count(main, weights)
    index = {x.addr: i for i, x in enumerate(main)}
    leaders = {0}
    for i, x in enumerate(main):
        t = _branch_target(x)
        if t is not None and t in index:
            leaders.add(index[t])
        if _is_exit_or_jump(x) and i + 1 < len(main):
            leaders.add(i + 1)
    starts = sorted(leaders)
    block_of = {}
    blocks = []  # (start, end) inclusive
    for bi, st in enumerate(starts):
        end = (starts[bi + 1] if bi + 1 < len(starts) else len(main)) - 1
        blocks.append((st, end))
        block_of[st] = bi
    succ = [[] for _ in blocks]
    exits = set()
    for bi, (st, end) in enumerate(blocks):
        last = main[end]
        conditional = bool(last.pred) or (last.base == "BRA" and re.match(r"!?U?P[0-6T]\b", last.args or ""))
        fall = bi + 1 if bi + 1 < len(blocks) else None
        if last.base == "EXIT":
            exits.add(bi)
            if last.pred and fall is not None:
                succ[bi].append(fall)
        elif last.base == "BRA":
            t = _branch_target(last)
            if t is not None and t in index and t > last.addr:
                succ[bi].append(block_of[index[t]])
            if (conditional or last.op.startswith("BRA.DIV") or t is None or t not in index) and fall is not None:
                succ[bi].append(fall)
            elif t is not None and t <= last.addr and fall is not None:
                succ[bi].append(fall)  # a loop's back edge: leave the loop after its weighted body
        elif fall is not None:
            succ[bi].append(fall)
        else:
            exits.add(bi)
    wsum = [sum(weights[i] for i in range(st, end + 1)) for st, end in blocks]
    best = [float("-inf")] * len(blocks)
    prev = [None] * len(blocks)
    best[0] = wsum[0]
    for bi in range(len(blocks)):
        if best[bi] == float("-inf"):
            continue
        for sj in succ[bi]:
            if sj > bi and best[bi] + wsum[sj] > best[sj]:
                best[sj] = best[bi] + wsum[sj]
                prev[sj] = bi
    end_block = max((b for b in exits if best[b] > float("-inf")), key=lambda b: best[b], default=None)
    if end_block is None:
        return count(main, weights)
    on_path = []
    b = end_block
    while b is not None:
        on_path.append(b)
        b = prev[b]
    idx = [i for b in on_path for i in range(blocks[b][0], blocks[b][1] + 1)]
    return count([main[i] for i in idx], [weights[i] for i in idx])


def sass_counts(instrs: list[Instr], radix_passes: int = RADIX_PASSES) -> SassCounts:
    main, cold = split_regions(instrs)
    loops = find_loops(main, radix_passes)
    weights = [1] * len(main)
    for lp in loops:
        for i in range(lp.start, lp.end + 1):
            weights[i] *= lp.trips
    return SassCounts(count(main), count(main, weights), len(cold),
                      [(lp.end - lp.start + 1, lp.trips) for lp in loops], longest_path(main, weights))


# ---------------------------------------------------------------------------------------------- resources

@dataclass
class Resources:
    regs: int
    stack: int = 0
    local: int = 0
    shared: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


def parse_res_usage(text: str) -> dict[str, Resources]:
    out = {}
    name = None
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            f = dict(re.findall(r"(\w+):(\d+)", line))
            out[name] = Resources(int(f.get("REG", 0)), int(f.get("STACK", 0)), int(f.get("LOCAL", 0)),
                                  int(f.get("SHARED", 0)))
            name = None
    return out


def parse_ptxas_spills(text: str) -> dict[str, tuple[int, int]]:
    """``ptxas -v`` log -> {function: (spill store bytes, spill load bytes)}."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            out[name] = (int(m.group(1)), int(m.group(2)))
            name = None
    return out


def parse_ptxas_smem(text: str) -> dict[str, int]:
    """``ptxas -v`` log -> {function: static shared memory in bytes, as the kernel declares it}.
    (cuobjdump -res-usage's SHARED adds the 1 KiB sm_90 reserves per block when there is any.)"""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"Used \d+ registers.*?(\d+) bytes smem", line)
        if m and name:
            out[name] = int(m.group(1))
    return out


def occupancy(regs: int, shared: int, threads: int) -> tuple[int, float]:
    """(resident blocks per SM, theoretical occupancy = resident warps / 64) on sm_90."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_regs = (REGS_PER_SM // regs_per_warp) // warps
    by_threads = THREADS_PER_SM // (warps * 32)
    by_smem = SMEM_PER_SM // (shared + SMEM_RESERVED_PER_BLOCK) if shared else BLOCKS_PER_SM
    blocks = max(0, min(BLOCKS_PER_SM, by_regs, by_threads, by_smem, WARPS_PER_SM // warps))
    return blocks, blocks * warps / WARPS_PER_SM


# ---------------------------------------------------------------------------------------------- estimate

@dataclass
class Estimate:
    warp_instr_per_sample: float
    issue_s: float
    fp64_s: float
    shfl_s: float
    mufu_s: float
    alu_s: float
    imad_s: float
    estimate_s: float  # the largest of the six
    bound: str  # which one
    bytes_per_sample: float
    memory_s: float
    ratio: float


def bytes_per_sample(n: int, elem_bytes: int = 4, deltas: bool = False) -> float:
    return elem_bytes * (3 if deltas else 2) + 8.0 / n


def estimate(per_thread: dict, threads_per_group: float, n: int, elem_bytes: int = 4, deltas: bool = False,
             n_samples: int = N_SAMPLES) -> Estimate:
    """Issue and memory time of n_samples samples in groups of n; per_thread: class counts of one
    thread's path; threads_per_group: threads that work on one group (fractional for Triton
    programs of several groups)."""
    per_sample = threads_per_group / n / 32.0  # warp-instructions per sample, per instruction of a thread
    w = {k: v * per_sample for k, v in per_thread.items()}
    clk = SMS * CLOCK_HZ
    issue = w["total"] * n_samples / (clk * SCHEDULERS)
    fp64 = w["fp64"] * n_samples / (clk * FP64_WARP_PER_CLK)
    shfl = w["shfl"] * n_samples / (clk * SHFL_WARP_PER_CLK)
    mufu = w["mufu"] * n_samples / (clk * MUFU_WARP_PER_CLK)
    alu = w.get("alu", 0) * n_samples / (clk * ALU_WARP_PER_CLK)
    imad = w.get("imad", 0) * n_samples / (clk * IMAD_WARP_PER_CLK)
    best, bound = max((issue, "issue"), (fp64, "fp64"), (shfl, "shfl"), (mufu, "mufu"), (alu, "alu"), (imad, "imad"))
    b = bytes_per_sample(n, elem_bytes, deltas)
    mem = b * n_samples / HBM_BPS
    return Estimate(w["total"], issue, fp64, shfl, mufu, alu, imad, best, bound, b, mem, best / mem)


# ---------------------------------------------------------------------------------------------- CUDA

# setup.py's bare-nvcc route, --split-compile included: nvcc then optimises each kernel on its own,
# as the shipped builds do (a whole-file compile of the default build spilled 5.6-11.4 KB in its
# kCentred segment kernels, which no shipped build does), and on every core (the default build:
# 6 min on 2 cores instead of 29).
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "--split-compile=0", "--threads=0"]


def compile_cuda(defines: list[str], out_dir: str, tag: str, csrc: str | None = None) -> tuple[str, str]:
    """<csrc>/cuda/advantages.cu (default: this tree's) -> <out_dir>/<tag>.cubin for sm_90; returns
    (cubin path, ptxas -v log)."""
    nvcc = find_tool("nvcc")
    csrc = csrc or os.path.join(REPO_DIR, "csrc")
    cubin = os.path.join(out_dir, f"{tag}.cubin")
    cmd = [nvcc, *NVCC_FLAGS, "-I", os.path.join(csrc, "include"), "-I", csrc,
           "-arch=sm_90", "-cubin", "-Xptxas", "-v", *[f"-D{d}" for d in defines],
           os.path.join(csrc, "cuda", "advantages.cu"), "-o", cubin]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{run.stderr[-3000:]}")
    return cubin, run.stdout + run.stderr


def cubin_report(cubin: str) -> tuple[dict[str, Resources], dict[str, list[Instr]]]:
    cuobjdump = find_tool("cuobjdump")
    res = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return parse_res_usage(res), parse_sass(sass)


@dataclass
class KernelRow:
    backend: str  # cuda | triton
    variant: str
    build: str  # default | <estimator>/fp32 | fp32 (triton)
    threads_per_block: int
    threads_per_group: float
    regs: int
    spill_stores: int
    spill_loads: int
    local: int
    shared: int
    blocks_per_sm: int
    occupancy: float
    loops: str
    cold: int
    static: dict = field(default_factory=dict)
    weighted: dict = field(default_factory=dict)
    path: dict = field(default_factory=dict)


def cuda_rows(build: str, defines: list[str], work: str, variants=CUDA_VARIANTS, log=print,
              csrc: str | None = None) -> list[KernelRow]:
    t0 = time.perf_counter()
    cubin, ptxas_log = compile_cuda(defines, work, build.replace("/", "_"), csrc)
    spills = parse_ptxas_spills(ptxas_log)
    smem = parse_ptxas_smem(ptxas_log)
    res, funcs = cubin_report(cubin)
    with open(os.path.join(csrc or os.path.join(REPO_DIR, "csrc"), "cuda", "advantages.cu")) as f:
        source = f.read()
    log(f"[static] cuda {build}: nvcc + cuobjdump {time.perf_counter() - t0:.0f} s")
    rows = []
    for v in variants:
        name = next((f for f in funcs if re.search(v.pattern, f)), None)
        if name is None:
            continue  # a shape of another revision of the launcher
        r = res[name]
        st, ld = spills.get(name, (0, 0))
        c = sass_counts(funcs[name], radix_passes(build, source, v.block_threads))
        shared = smem.get(name, r.shared) + v.dynamic_smem
        blocks, occ = occupancy(r.regs, shared, v.block_threads)
        rows.append(KernelRow("cuda", v.name, build, v.block_threads, v.group_threads, r.regs, st, ld, r.local,
                              shared, blocks, occ, _loops_text(c.loops), c.cold, c.static, c.weighted, c.path))
    if not rows:
        raise RuntimeError(f"none of the known kernels is in {cubin}")
    return rows


def estimator_defines(name: str) -> list[str]:
    """The analysis macros of a ``<estimator>/fp32`` build (see the module docstring)."""
    from bonkernels import estimators, tables

    defines = [f"BK_STATIC_ESTIMATOR_CODE={estimators.get(name).code}", "BK_STATIC_FP32", "BK_STATIC_FULL_GROUPS"]
    if name in tables.BANK_ESTIMATORS:
        defines.append("BK_STATIC_BANKED")
    return defines


def _loops_text(loops) -> str:
    return " ".join(f"{size}x{trips}" for size, trips in loops) or "-"


# ---------------------------------------------------------------------------------------------- Triton

def compile_triton(dtype: str, block: int, code: int | None = None):
    """aot.compile_one's compile for sm_90; with ``code``, the estimator's facts and whether it
    reads a bank (as a single-k call on [G, n] rewards does) are made compile-time constants: the
    kernel a GPU launch of that call builds, in the layout of a batch that fills the GPU."""
    from bonkernels import estimators, tables
    from bonkernels.triton import _config, _sources, aot

    if code is None:  # every estimator: the kernel with the off-policy branch
        cfg = _config.config_for_block(block, True)
        return cfg, aot.compile_one(aot.Specialisation(dtype, cfg), 90)
    est = estimators.BY_CODE[code]
    # the path of a single-k call on [G, n] rewards: one k's bank where the estimator takes one
    has_bank = est.name in tables.BANK_ESTIMATORS
    cfg = _config.config_for_block(block, est.needs_deltas, own_kernel=True, centred=est.centred,
                                   serial_block=_config.serial_lanes_up_to(est, has_bank))
    constants = _sources.constants_of(est, has_bank)
    return cfg, aot.compile_one(aot.Specialisation(dtype, cfg, constants), 90)


def triton_rows(blocks=TRITON_BLOCKS, dtype: str = "fp32", work: str = ".", budget_s: float = 900,
                estimator: str | None = None, log=print) -> list[KernelRow]:
    ptxas = _triton_bin("ptxas") or find_tool("ptxas")
    cuobjdump = find_tool("cuobjdump")
    code = None
    if estimator is not None:
        from bonkernels import estimators

        code = estimators.get(estimator).code
    build = dtype if estimator is None else f"{estimator}/{dtype}"
    rows, t_start = [], time.perf_counter()
    for block in blocks:
        if time.perf_counter() - t_start > budget_s:
            log(f"[static] triton {build} BLOCK={block}: skipped (budget of {budget_s:.0f} s spent)")
            continue
        t0 = time.perf_counter()
        cfg, compiled = compile_triton(dtype, block, code)
        ptx = compiled.asm["ptx"]
        tag = build.replace("/", "_")
        ptx_path = os.path.join(work, f"triton_{tag}_{block}.ptx")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        v = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx_path, "-o", os.devnull], capture_output=True, text=True)
        text = v.stdout + v.stderr
        regs = int(re.search(r"Used (\d+) registers", text).group(1))
        sp = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
        smem_ptxas = re.search(r"(\d+) bytes smem", text)
        shared = int(getattr(compiled.metadata, "shared", 0) or (smem_ptxas.group(1) if smem_ptxas else 0))
        cubin_path = os.path.join(work, f"triton_{tag}_{block}.cubin")
        with open(cubin_path, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([cuobjdump, "-sass", cubin_path], capture_output=True, text=True, check=True).stdout
        funcs = parse_sass(sass)
        instrs = next(iter(funcs.values()))
        c = sass_counts(instrs)
        threads = cfg.num_warps * 32
        blocks_sm, occ = occupancy(regs, shared, threads)
        rows.append(KernelRow("triton", f"triton BLOCK={block} GROUPS={cfg.groups} warps={cfg.num_warps}"
                              f"{' lanes' if cfg.lanes else ''}", build, threads, threads / cfg.groups, regs,
                              int(sp.group(1)) if sp else 0, int(sp.group(2)) if sp else 0, 0, shared, blocks_sm,
                              occ, _loops_text(c.loops), c.cold, c.static, c.weighted, c.path))
        log(f"[static] triton {build} BLOCK={block}: {time.perf_counter() - t0:.0f} s, {regs} registers, "
            f"{c.static['total']} SASS")
    return rows


def triton_block_for(n: int) -> int:
    block = 8
    while block < n:
        block *= 2
    return block


# ---------------------------------------------------------------------------------------------- tables

def estimate_rows(kernels: list[KernelRow], ns=NS) -> list[dict]:
    """One row per (n, backend, build): the variant the launcher picks for n, and its estimate."""
    out = []
    present = {}
    for k in kernels:
        present.setdefault(k.build, set()).add(k.variant)
    for n in ns:
        for k in kernels:
            if k.backend == "cuda":
                if k.variant != cuda_variant_for(n, present[k.build], k.build).name:
                    continue
            elif not k.variant.startswith(f"triton BLOCK={triton_block_for(n)} "):
                continue
            est_name = k.build.split("/")[0]
            deltas = est_name == "maxk_offpolicy"
            per_thread = k.path or k.weighted
            e = estimate(per_thread, k.threads_per_group, n, 4, deltas)
            out.append({"n": n, "backend": k.backend, "variant": k.variant, "build": k.build,
                        "regs": k.regs, "spills": k.spill_stores + k.spill_loads, "smem": k.shared,
                        "occupancy": round(k.occupancy, 3), "sass_per_thread": per_thread["total"],
                        "thread_instr_per_sample": per_thread["total"] * k.threads_per_group / n,
                        **{f"{f}": v for f, v in asdict(e).items()}})
    return out


def _us(s: float) -> str:
    return f"{s * 1e6:,.0f}" if s * 1e6 >= 10 else f"{s * 1e6:.1f}"


def kernels_markdown(kernels: list[KernelRow]) -> str:
    head = ("| backend | variant | build | threads/block | regs | spills st/ld B | smem B | blocks/SM | occupancy | "
            "SASS main (static) | weighted | longest path | SHFL | MATCH | WARPSYNC | BAR | FP64 | MUFU | LDG | STG | "
            "LDS+STS | branches | loops (instr x trips) | cold stubs |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k in kernels:
        w = k.path or k.weighted
        lines.append(f"| {k.backend} | {k.variant} | {k.build} | {k.threads_per_block} | {k.regs} | "
                     f"{k.spill_stores}/{k.spill_loads} | {k.shared} | {k.blocks_per_sm} | {k.occupancy:.0%} | "
                     f"{k.static['total']:,} | {k.weighted['total']:,} | {w['total']:,} | {w['shfl']:,} | "
                     f"{w['match']:,} | {w['warpsync']:,} | {w['bar']:,} | {w['fp64']:,} | {w['mufu']:,} | "
                     f"{w['ldg']:,} | {w['stg']:,} | {w['lds_sts']:,} | {w['branch']:,} | {k.loops} | {k.cold:,} |")
    return "\n".join(lines)


def estimate_markdown(rows: list[dict]) -> str:
    head = ("| n | variant | build | regs | spills | smem B | occupancy | SASS/thread | SASS/sample (thread-instr) | "
            "warp-instr/sample | bytes/sample | issue us | FP64 us | SHFL us | ALU us | estimate us (bound) | "
            "memory us | issue / memory | estimate / memory |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['n']} | {r['variant']} | {r['build']} | {r['regs']} | {r['spills']} | {r['smem']} | "
                     f"{r['occupancy']:.0%} | {r['sass_per_thread']:,} | {r['thread_instr_per_sample']:,.0f} | "
                     f"{r['warp_instr_per_sample']:.1f} | {r['bytes_per_sample']:.2f} | {_us(r['issue_s'])} | "
                     f"{_us(r['fp64_s'])} | {_us(r['shfl_s'])} | {_us(r['alu_s'])} | "
                     f"{_us(r['estimate_s'])} ({r['bound']}) | {_us(r['memory_s'])} | "
                     f"{r['issue_s'] / r['memory_s']:.2f}x | {r['ratio']:.2f}x |")
    return "\n".join(lines)


MODEL = f"""Model (H200, sm_90): N = {N_SAMPLES:,} samples in groups of n; issue time = warp-instructions /
({SMS} SMs x {SCHEDULERS} schedulers x 1 warp-instruction/clk x {CLOCK_HZ / 1e9:.2f} GHz), dual issue ignored;
pipe bounds FP64 {int(FP64_WARP_PER_CLK * 32)} lanes/clk/SM, SHFL {int(SHFL_WARP_PER_CLK * 32)} lanes/clk/SM,
MUFU {int(MUFU_WARP_PER_CLK * 32)} lanes/clk/SM, ALU and IMAD {int(ALU_WARP_PER_CLK * 32)} lanes/clk/SM each;
estimate = the largest of the six ("issue / memory" is the issue bound alone); memory time =
bytes/sample x N / {HBM_BPS / 1e12:.1f} TB/s (fp32 values + output, + deltas off-policy, + 8/n offset bytes).
SASS per thread = the longest path through the main region of the function (slow-path
WARPSYNC.COLLECTIVE stubs apart), the radix-sort pass loop x {RADIX_PASSES} (x {RADIX_PASSES_NARROW} in the
`<estimator>/fp32` builds of a source whose block sort skips the bits float32 cannot set): for the
`<estimator>/fp32` builds an upper bound on one thread's path with no divergence (the longest arm
of each kept branch counts), for the shipped builds (`default`, Triton `fp32`: jump tables, no
graph) every instruction of the function, a much looser bound. Latency, occupancy and L2 traffic are not modelled."""


def write_outputs(out: str, kernels: list[KernelRow], rows: list[dict], meta: dict) -> str:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kernels.csv"), "w", newline="") as f:
        fields = [k for k in asdict(kernels[0]) if k not in ("static", "weighted", "path")]
        w = csv.writer(f)
        w.writerow(fields + [f"{kind}_{c}" for kind in ("static", "weighted", "path") for c in CLASSES])
        for k in kernels:
            d = asdict(k)
            w.writerow([d[x] for x in fields] + [getattr(k, kind)[c] for kind in ("static", "weighted", "path")
                                                 for c in CLASSES])
    if rows:
        with open(os.path.join(out, "estimate.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    with open(os.path.join(out, "static.json"), "w") as f:
        json.dump({"meta": meta, "kernels": [asdict(k) for k in kernels], "estimate": rows}, f, indent=1)
    md = [f"# Static proxies (sm_90), {meta['date_utc']}", "",
          f"`python -m bench.static_kernels {meta['options']}`; nvcc {meta.get('nvcc', '?')}, "
          f"triton {meta.get('triton', '?')}, bonkernels {meta.get('commit', '?')}.", "", MODEL, "",
          "## Kernels", "", kernels_markdown(kernels), "", "## Estimate per n", "", estimate_markdown(rows), ""]
    path = os.path.join(out, "REPORT.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path


def _meta(options: str) -> dict:
    meta = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "options": options}
    try:
        v = subprocess.run([find_tool("nvcc"), "--version"], capture_output=True, text=True).stdout
        meta["nvcc"] = re.search(r"release ([\d.]+)", v).group(1)
    except Exception:  # noqa: BLE001 - metadata only
        pass
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_DIR,
                               capture_output=True, text=True).stdout.strip()
        meta["commit"] = c.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        pass
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "results", "static_sm90"))
    ap.add_argument("--quick", action="store_true", help="one small build (grpo/fp32), thread_kernel<8,centred> only")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--no-cuda", action="store_true", help="the Triton kernels only (a minute or two)")
    ap.add_argument("--triton-budget-s", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep the cubins and PTX (in <out>/build)")
    ap.add_argument("--source-rev", help="compile csrc/ of this git revision instead of the working tree "
                    "(CUDA only: e.g. the old kernels next to a redesign; per-estimator builds need a "
                    "revision with the BK_STATIC_* macros)")
    a = ap.parse_args(argv)
    if a.no_cuda and a.no_triton:
        ap.error("--no-cuda and --no-triton leave nothing to compile")
    if not have_tools():
        print("[static] nvcc or cuobjdump not found: nothing to do", file=sys.stderr)
        return 2

    work = os.path.join(a.out, "build") if a.keep else tempfile.mkdtemp(prefix="bk_static_")
    os.makedirs(work, exist_ok=True)
    kernels: list[KernelRow] = []
    try:
        if a.quick:
            kernels += cuda_rows("grpo/fp32", estimator_defines("grpo"), work,
                                 variants=[v for v in CUDA_VARIANTS if v.name == "thread_kernel<8,centred>"])
        else:
            csrc = None
            if a.source_rev:
                src = os.path.join(work, "src")
                os.makedirs(src, exist_ok=True)
                archive = subprocess.run(["git", "-C", REPO_DIR, "archive", a.source_rev, "csrc"], capture_output=True,
                                         check=True).stdout
                subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
                csrc = os.path.join(src, "csrc")
            if not a.no_cuda:
                kernels += cuda_rows("default", [], work, csrc=csrc)
                with open(os.path.join(csrc or os.path.join(REPO_DIR, "csrc"), "cuda", "advantages.cu")) as f:
                    has_macros = "BK_STATIC_ESTIMATOR_CODE" in f.read()
                if not has_macros:
                    print("[static] this advantages.cu has no BK_STATIC_* macros: default build only", flush=True)
                for name in ESTIMATORS if has_macros else ():
                    kernels += cuda_rows(f"{name}/fp32", estimator_defines(name), work, csrc=csrc)
            if not a.no_triton:
                t0 = time.perf_counter()
                kernels += triton_rows(work=work, budget_s=a.triton_budget_s)
                for name in ESTIMATORS:
                    left = a.triton_budget_s - (time.perf_counter() - t0)
                    kernels += triton_rows(work=work, budget_s=left, estimator=name)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = estimate_rows(kernels, (8,) if a.quick else NS)
    meta = _meta(" ".join(sys.argv[1:] if argv is None else argv))
    if a.source_rev:
        meta["cuda_source_rev"] = a.source_rev
    path = write_outputs(a.out, kernels, rows, meta)
    print(estimate_markdown(rows))
    print(f"[static] wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
