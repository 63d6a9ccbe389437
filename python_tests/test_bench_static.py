"""bench/static_kernels.py: the SASS parser, the occupancy and issue/memory arithmetic, and (where
nvcc and cuobjdump exist) a --quick run on one small kernel variant."""

import json
import re
from pathlib import Path
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import static_kernels as sk  # noqa: E402

SASS = """
\t\tFunction : _ZN2bk4cuda11warp_kernelILi8EEEviPKvPKlS3_PvllNS_6ParamsE
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe20000000800 */
        /*0010*/                   SHFL.BFLY PT, R3, R2, 0x1, 0x181f ;    /* 0x0 */
        /*0020*/                   DFMA R4, R2, R2, R4 ;                  /* 0x0 */
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;          /* 0x0 */
        /*0040*/               @!P0 BRA 0x10 ;                            /* 0x0 */
        /*0050*/                   MUFU.RCP64H R6, R5 ;                   /* 0x0 */
        /*0060*/                   STG.E desc[UR4][R2.64], R6 ;           /* 0x0 */
        /*0070*/                   EXIT ;                                 /* 0x0 */
        /*0080*/                   BSSY B0, 0xc0 ;                        /* 0x0 */
        /*0090*/                   WARPSYNC.COLLECTIVE R35, 0xb0 ;        /* 0x0 */
        /*00a0*/                   SHFL.BFLY P6, R0, R30, R29, R0 ;       /* 0x0 */
        /*00b0*/                   ENDCOLLECTIVE ;                        /* 0x0 */
        /*00c0*/                   BSYNC B0 ;                             /* 0x0 */
        /*00d0*/                   BRA 0x50 ;                             /* 0x0 */
        /*00e0*/                   BRA 0xe0;                              /* 0x0 */
        /*00f0*/                   NOP;                                   /* 0x0 */
"""


def test_parse_and_count_sass():
    funcs = sk.parse_sass(SASS)
    (name, instrs), = funcs.items()
    assert "warp_kernelILi8EE" in name
    assert len(instrs) == 16
    assert instrs[4].pred == "@!P0" and instrs[4].op == "BRA"
    c = sk.sass_counts(instrs)
    # main: 0x00..0x70 (8 instructions); cold: the collective stub (6); padding dropped
    assert c.static["total"] == 8 and c.cold == 6
    assert c.static["shfl"] == 1 and c.static["fp64"] == 1 and c.static["mufu"] == 1
    assert c.static["bar"] == 1 and c.static["stg"] == 1 and c.static["branch"] == 2
    # the backward branch 0x40 -> 0x10 holds a BAR: a radix pass loop of 4 instructions x 16
    assert c.loops == [(4, sk.RADIX_PASSES)]
    assert c.weighted["total"] == 8 + 4 * (sk.RADIX_PASSES - 1)
    assert c.weighted["shfl"] == sk.RADIX_PASSES


def test_occupancy_sm90():
    # 256 threads, 44 registers: 44*32 -> 1536 per warp (256-register units), 42 warps -> 5 blocks
    assert sk.occupancy(44, 0, 256) == (5, 5 * 8 / 64)
    # 32 registers, 256 threads: thread-limited to 8 blocks = 100 %
    assert sk.occupancy(32, 0, 256) == (8, 1.0)
    # 512 threads, 128 registers: 4096 per warp, 16 warps per SM -> 1 block of 16 warps
    assert sk.occupancy(128, 34816, 512) == (1, 0.25)
    # shared-memory limited: 100 KiB per block -> 2 blocks
    assert sk.occupancy(16, 100 * 1024, 64)[0] == 2


def test_estimate_arithmetic():
    per_thread = dict.fromkeys(sk.CLASSES, 0)
    per_thread.update(total=550, fp64=100, shfl=75, mufu=4)
    n = 16
    e = sk.estimate(per_thread, threads_per_group=16, n=n)
    # one lane per sample: 550 thread-instructions = 550/32 warp-instructions per sample
    assert e.warp_instr_per_sample == pytest.approx(550 / 32)
    clk = sk.SMS * sk.CLOCK_HZ
    assert e.issue_s == pytest.approx(550 / 32 * sk.N_SAMPLES / (clk * 4))
    assert e.fp64_s == pytest.approx(100 / 32 * sk.N_SAMPLES / (clk * 2))
    assert e.shfl_s == pytest.approx(75 / 32 * sk.N_SAMPLES / clk)
    assert e.estimate_s == max(e.issue_s, e.fp64_s, e.shfl_s, e.mufu_s, e.alu_s, e.imad_s) and e.bound == "issue"
    # the integer pipes take one warp-instruction per two clocks per scheduler: 300 ALU instructions
    # of 550 bind the estimate
    per_thread.update(alu=300, imad=40)
    e_alu = sk.estimate(per_thread, threads_per_group=16, n=n)
    assert e_alu.alu_s == pytest.approx(300 / 32 * sk.N_SAMPLES / (clk * 2))
    assert e_alu.imad_s == pytest.approx(40 / 32 * sk.N_SAMPLES / (clk * 2))
    assert e_alu.bound == "alu" and e_alu.estimate_s == e_alu.alu_s > e_alu.issue_s
    # the issue's own figures: ~0.28 ms of issue, ~33 us to move 8 B + 8/16 B per sample at 4.3 TB/s
    assert 250e-6 < e.issue_s < 300e-6
    assert e.bytes_per_sample == 8.5
    assert e.memory_s == pytest.approx(8.5 * sk.N_SAMPLES / 4.3e12)
    assert e.ratio == pytest.approx(e.estimate_s / e.memory_s)
    # a block kernel: 128 threads on a group of 64 samples doubles the per-sample count
    assert sk.estimate(per_thread, 128, 64).warp_instr_per_sample == pytest.approx(550 * 2 / 32)
    assert sk.bytes_per_sample(16, 4, deltas=True) == 12.5


def _lane_code_case(calls: str) -> str:
    """The body of group_math.h's lane_code for one LaneCalls set."""
    src = (Path(sk.REPO_DIR) / "csrc" / "include" / "bonkernels" / "group_math.h").read_text()
    body = src[src.index("BK_HD constexpr int lane_code("):]
    body = body[:body.index("\n}\n")]
    body = body[body.index(f"case LaneCalls::{calls}:") + len(f"case LaneCalls::{calls}:"):]
    return re.split(r"\n    (?:case LaneCalls::|default:)", body)[0]


@pytest.mark.parametrize("calls, builds", [("kWide", sk.WIDE_LANE_BUILDS), ("kWideOffPolicy", sk.OFF_WIDE_BUILDS)])
def test_lane_builds_follow_the_source(calls, builds):
    """WIDE_LANE_BUILDS and OFF_WIDE_BUILDS list the estimators of group_math.h's lane_code for
    LaneCalls::kWide and kWideOffPolicy."""
    from bonkernels import estimators

    body = _lane_code_case(calls)
    taken = {c.lower() for c in re.findall(r"case (\w+):", body[:body.index("default:")])}
    assert taken == {b.split("/")[0] for b in builds}
    assert all(estimators.get(name) for name in taken)


def test_centred_lane_builds_are_the_registrys_centred_set():
    """lane_code takes the registry's centred estimators (the generated predicate) into
    LaneCalls::kCentred, and CENTRED_LANE_BUILDS builds exactly those."""
    from bonkernels import estimators

    assert _lane_code_case("kCentred").split() == ["return", "centred(code)", "?", "code", ":", "-1;"]
    assert {b.split("/")[0] for b in sk.CENTRED_LANE_BUILDS} == {
        e.name for e in estimators.REGISTRY.values() if e.centred} == {"grpo", "rloo", "dr_grpo", "maxrl"}


def test_radix_passes_follow_the_source():
    narrow = "Sort(keys, idx, kRadixBeginBitNarrow, 64); constexpr int kRadixNarrowMaxBlock = 256;"
    assert sk.radix_passes("maxk_loo1/fp32", narrow, 256) == 9
    assert sk.radix_passes("maxk_loo1/fp32", narrow, 512) == sk.RADIX_PASSES   # the 512-thread block
    assert sk.radix_passes("default", narrow) == sk.RADIX_PASSES      # every dtype: double keys too
    assert sk.radix_passes("maxk_loo1/fp32", "Sort(keys, idx)") == sk.RADIX_PASSES   # an older source


def test_variant_for_n_follows_the_launcher():
    assert sk.cuda_variant_for(8).name == "thread_kernel<8,wide>"  # (None: a wide-lane call)
    assert sk.cuda_variant_for(16, build="maxk_loo1/fp32").name == "thread_kernel<16,wide>"
    assert sk.cuda_variant_for(16, {"thread_kernel<16>"}, build="maxk_loo1/fp32").name == "thread_kernel<16>"
    assert sk.cuda_variant_for(16, build="chen_passk/fp32").name == "thread_kernel<16>"
    # the off-policy estimators have their own small-group instantiations: maxk_offpolicy from a
    # bank on float32 rewards the float one (an older build: kAll's, or the one kernel)
    assert sk.cuda_variant_for(16, build="maxk_offpolicy/fp32").name == "thread_kernel<16,offwide>"
    assert sk.cuda_variant_for(8, build="maxk_offpolicy/fp32").name == "thread_kernel<8,offwide>"
    older = {"thread_kernel<8,off>", "thread_kernel<16,off>", "thread_kernel<32>", "segment_kernel<2>",
             "segment_kernel<4>"}
    assert sk.cuda_variant_for(16, older, build="maxk_offpolicy/fp32").name == "thread_kernel<16,off>"
    assert sk.cuda_variant_for(8, older, build="maxk_offpolicy/fp32").name == "thread_kernel<8,off>"
    assert sk.cuda_variant_for(32, older, build="maxk_offpolicy/fp32").name == "segment_kernel<2>"
    assert sk.cuda_variant_for(64, older, build="maxk_offpolicy/fp32").name == "segment_kernel<4>"
    assert sk.cuda_variant_for(16, build="default").name == "thread_kernel<16>"
    # grpo, rloo, dr_grpo and maxrl have theirs (an older build: the on-policy one)
    assert sk.cuda_variant_for(16, build="grpo/fp32").name == "thread_kernel<16,centred>"
    assert sk.cuda_variant_for(8, build="maxrl/fp32").name == "thread_kernel<8,centred>"
    assert sk.cuda_variant_for(16, {"thread_kernel<16>"}, build="grpo/fp32").name == "thread_kernel<16>"
    # grpo is in kWide too, but the launcher sends it to kCentred first (float_set_of)
    assert sk.cuda_variant_for(32, build="grpo/fp32").name == "segment_kernel<2,centred>"
    assert sk.cuda_variant_for(16, {"thread_kernel<16>"}, build="maxk_offpolicy/fp32").name == "thread_kernel<16>"
    assert sk.cuda_variant_for(32).name == "thread_kernel<32>"
    assert sk.cuda_variant_for(32, build="maxk_loo1/fp32").name == "thread_kernel<32>"
    assert sk.cuda_variant_for(32, build="maxk_offpolicy/fp32").name == "thread_kernel<32,offwide>"
    # the calls a wide lane does not take, and a build for every call, run the 2-lane segment kernel
    assert sk.cuda_variant_for(32, build="default").name == "segment_kernel<2>"
    assert sk.cuda_variant_for(32, build="rloo/fp32").name == "segment_kernel<2,centred>"
    # groups of exactly 64 of a wide-lane call run one per thread; below 64 (and on a build
    # without that kernel) the segment kernel has the same float-set instantiations (an older
    # build: one kernel)
    assert sk.cuda_variant_for(64).name == "thread_kernel<64>"
    assert sk.cuda_variant_for(64, build="maxk_loo1/fp32").name == "thread_kernel<64>"
    assert sk.cuda_variant_for(63, build="maxk_loo1/fp32").name == "segment_kernel<4,wide>"
    assert sk.cuda_variant_for(48).name == "segment_kernel<4,wide>"
    assert sk.cuda_variant_for(64, {"segment_kernel<4,wide>"}, build="maxk_loo1/fp32").name == "segment_kernel<4,wide>"
    assert sk.cuda_variant_for(64, build="grpo/fp32").name == "segment_kernel<4,centred>"
    assert sk.cuda_variant_for(64, build="maxk_offpolicy/fp32").name == "thread_kernel<64,offwide>"
    assert sk.cuda_variant_for(63, build="maxk_offpolicy/fp32").name == "segment_kernel<4,offwide>"
    assert sk.cuda_variant_for(64, {"segment_kernel<4,offwide>"}, build="maxk_offpolicy/fp32").name == "segment_kernel<4,offwide>"
    assert sk.cuda_variant_for(64, build="maxk_loo1/fp32").name != "thread_kernel<64,offwide>"
    assert sk.cuda_variant_for(64, build="default").name == "segment_kernel<4>"
    assert sk.cuda_variant_for(64, {"segment_kernel<4>"}, build="grpo/fp32").name == "segment_kernel<4>"
    # an older launcher: the sub-warp kernel at 32, a 32-thread block at 64
    assert sk.cuda_variant_for(32, {"thread_kernel<16>", "warp_kernel<32>"}).name == "warp_kernel<32>"
    assert sk.cuda_variant_for(64, {"block_kernel<32,2>", "block_kernel<128,2>"}).name == "block_kernel<32,2>"
    assert sk.cuda_variant_for(128, build="default").name == "segment_kernel<8>"
    assert sk.cuda_variant_for(256, build="default").name == "segment_kernel<16>"
    assert sk.cuda_variant_for(512, build="default").name == "segment_kernel<32>"
    # a build of the launcher before the size buckets (no small-group kernel): its sub-warp kernels
    old = {"warp_kernel<8>", "warp_kernel<16>", "warp_kernel<32>", "block_kernel<128,2>"}
    assert sk.cuda_variant_for(8, old).name == "warp_kernel<8>"
    assert sk.cuda_variant_for(16, old).name == "warp_kernel<16>"
    assert sk.cuda_variant_for(64, old).name == "block_kernel<128,2>"
    assert sk.cuda_variant_for(1024).name == "block_kernel<256,4>"
    assert sk.cuda_variant_for(4096).name == "block_kernel<512,8>"
    assert sk.triton_block_for(5) == 8 and sk.triton_block_for(1024) == 1024


def test_nvcc_flags_are_the_shipped_ones():
    """The tool compiles with setup.py's bare-nvcc flags, --split-compile included: a whole-file
    compile optimises the kernels side by side, and it spilled in kernels that no shipped build spills."""
    import ast

    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    tree = ast.parse(setup)
    (parallel,) = [ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "NVCC_PARALLEL" for t in node.targets)]
    bare_route = next(node for node in ast.walk(tree)
                      if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "cmd" for t in node.targets))
    literals = [e.value for e in bare_route.value.elts if isinstance(e, ast.Constant)]
    shipped = [f for f in literals if f in ("-O3", "-std=c++17", "--expt-relaxed-constexpr")] + parallel
    assert sorted(sk.NVCC_FLAGS) == sorted(shipped)
    assert "--split-compile=0" in sk.NVCC_FLAGS


@pytest.mark.skipif(not sk.have_tools(), reason="nvcc or cuobjdump not found")
def test_quick_run_parses_a_real_cubin(tmp_path):
    assert sk.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "static.json").read_text())
    (k,) = data["kernels"]
    assert k["variant"] == "thread_kernel<8,centred>" and k["build"] == "grpo/fp32"
    assert 0 < k["regs"] <= 255 and k["spill_stores"] == 0
    assert 0 < k["occupancy"] <= 1
    # one thread per group: no shuffles; each sample's result goes into the shared-memory tile (a
    # store per sample), and the block copies the tile out with global stores: unrolled rounds, so
    # both copies out (the whole block's and a thread's own group's) hold all 8 of their stores and
    # the count, which takes every loop body once, sees each round
    assert k["static"]["total"] > 100 and k["static"]["shfl"] == 0
    assert k["static"]["lds_sts"] >= 8 and k["static"]["stg"] >= 2 * 8
    assert k["weighted"]["total"] >= k["static"]["total"]
    (row,) = data["estimate"]
    assert row["n"] == 8 and row["issue_s"] > 0 and row["memory_s"] > 0
    assert (tmp_path / "REPORT.md").exists() and (tmp_path / "kernels.csv").exists()


@pytest.mark.skipif(sk.find_tool("nvcc") is None, reason="nvcc not found")
def test_kernel_spills_script_compiles_one_kernel():
    # scripts/kernel_spills.sh cuts advantages.cu at its launcher and instantiates one kernel: the
    # cut line and the kernels' parameters must still be what the script expects
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    run = subprocess.run(["bash", str(repo / "scripts" / "kernel_spills.sh"), "90",
                          "thread_kernel<8, LaneCalls::kCentred>"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    line = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sm_90 thread_kernel<8, LaneCalls::kCentred>: Used \d+ registers, "
                        r"0 bytes spill stores, 0 bytes spill loads", line), line


DIAMOND = """
\t\tFunction : k
        /*0000*/                   ISETP.GE.AND P0, PT, R0, RZ, PT ;
        /*0010*/                @P0 BRA 0x50 ;
        /*0020*/                   DADD R2, R2, R2 ;
        /*0030*/                   DADD R2, R2, R2 ;
        /*0040*/                   BRA 0x70 ;
        /*0050*/                   MUFU.RCP64H R3, R2 ;
        /*0060*/                   MOV R1, R2 ;
        /*0070*/                   STG.E desc[UR4][R2.64], R6 ;
        /*0080*/               @!P1 BRA.DIV UR4, 0xb0 ;
        /*0090*/                   SHFL.BFLY PT, R3, R2, 0x1, 0x181f ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   WARPSYNC.COLLECTIVE R35, 0xd0 ;
        /*00c0*/                   SHFL.BFLY P6, R0, R30, R29, R0 ;
        /*00d0*/                   ENDCOLLECTIVE ;
        /*00e0*/                   BRA 0x90 ;
"""


def test_longest_path_takes_the_longer_arm_and_skips_cold_stubs():
    (instrs,) = sk.parse_sass(DIAMOND).values()
    c = sk.sass_counts(instrs)
    assert c.static["total"] == 11 and c.cold == 4
    # the DADD arm (3 with its BRA) is longer than the MUFU arm (2): 0,1,2,3,4 then 7,8,9,a
    assert c.path["total"] == 9
    assert c.path["fp64"] == 2 and c.path["mufu"] == 0 and c.path["shfl"] == 1


PTXAS_LOG = """ptxas info    : Compiling entry function '_Z5blockv' for 'sm_90'
ptxas info    : Function properties for _Z5blockv
    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 33792 bytes smem
ptxas info    : Compiling entry function '_Z4warpv' for 'sm_90'
ptxas info    : Function properties for _Z4warpv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 44 registers, used 0 barriers
"""


def test_parse_ptxas_log():
    assert sk.parse_ptxas_spills(PTXAS_LOG) == {"_Z5blockv": (8, 12), "_Z4warpv": (0, 0)}
    assert sk.parse_ptxas_smem(PTXAS_LOG) == {"_Z5blockv": 33792}

