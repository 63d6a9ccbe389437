"""The GPU speed targets of the kernel redesign, measured in one run on a CUDA machine.

    python -m bench.gpu_limits --out DIR            # CUDA: under a minute on an H200 once the extension is built
    python -m bench.gpu_limits --dry-run --out DIR  # the same flow on the CPU kernel, tiny sizes (CI)

Every call is ``bk.advantages(rewards, 4, estimator, check_inputs=False, max_group_size=n,
backend=B)`` on float32 [G, n] rewards ~ U(0, 1) (maxk_offpolicy: with deltas and clamp_delta), for
B in (cuda, triton), and the estimators maxk_loo1, maxk_offpolicy and grpo; ``triton-spread`` is
the Triton backend with its thread-per-group layout turned off (a group spread over many threads,
as every block used before the lanes), timed beside it where the lanes run (n <= 16, n = 32 for
the on-policy estimators and n = 64 for grpo) as an A/B of the two layouts; ``triton-generic``
launches the kernel with every estimator instead of the one compiled for the call's estimator, in
the same layouts (timed at every n, in lanes or spread as triton, except grpo at 64, and on the
small batch: the A/B of that specialisation). Measured:

* bandwidth, N = 2^24 samples in groups of n in (8, 16, 32, 64, 128, 512, 1024, 4096): the time of one call
  (CUDA events, L2 flushed before each repetition; bench/timing.py), the bytes it must move
  (4 B read + 4 B written per sample, + 4 B of deltas off-policy), and that rate as a fraction of
  ``out.copy_(rewards)`` timed the same way in the same run;
* small batch, G = 1024, n = 16: the kernels' own time per call (torch.profiler: the sum of the
  call's CUDA kernel durations), the wall time per call (1,000 calls back to back, one sync at the
  end) and the replay time per call of a CUDA graph holding 100 calls; the same for one torch op
  of one kernel (``out.copy_``), the floor of any call from Python, and for each backend B the
  same call prepared once (``plan:B``, ``bk.prepare_advantages``: no per-call checks or dispatch);
* crossover, n = 16, G from 1,024 to 262,144: the kernels' time per call of triton and
  triton-spread, to find the batch size from which a thread per group pays.

The issue's targets, checked in the report: at N = 16M, n = 16 at least 70 % of the copy
bandwidth for cuda and 50 % for triton; at G = 1024, n = 16 a kernel time under 5 us and a wall time
under 15 us per call. Writes gpu_limits.json and REPORT.md into the --out folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import environment, timing  # noqa: E402

NS = (8, 16, 32, 64, 128, 512, 1024, 4096)
ESTIMATORS = ("maxk_loo1", "maxk_offpolicy", "grpo")
K = 4
CLAMP_DELTA = 0.2
TARGET_FRACTION = {"cuda": 0.70, "triton": 0.50}
TARGET_KERNEL_US, TARGET_WALL_US = 5.0, 15.0


SPREAD = "triton-spread"  # the Triton backend without its thread-per-group layout (an A/B)
GENERIC = "triton-generic"  # its launches without the estimator's own kernel (an A/B)
# the A/B cells (at N = 2^24, where bandwidth_cell_runs says)
LANE_AB = (SPREAD, GENERIC)
PLAN = "plan:"  # plan:<backend>: the call prepared once (small batch only: the same kernels)


@contextlib.contextmanager
def spread_layout():
    """The Triton launcher picks a group spread over many threads at every block (its launch
    configurations are recomputed on the way in and out)."""
    from bonkernels.triton import _config

    saved = _config.LANE_MAX_BLOCK
    _config.LANE_MAX_BLOCK = 0
    _config.config_for_block.cache_clear()
    try:
        with _config.own_kernel_lanes(False):
            yield
    finally:
        _config.LANE_MAX_BLOCK = saved
        _config.config_for_block.cache_clear()


@contextlib.contextmanager
def generic_kernel():
    """Launches run the kernel with every estimator (no per-estimator compile), in the layouts of
    the estimator's own kernels (lanes up to the same blocks)."""
    from bonkernels.triton import _config

    with _config.specialised_kernels(False), _config.own_kernel_lanes(True):
        yield


def _lane_max_block(estimator: str) -> int:
    """The largest n whose launches run a thread per group (on a batch that fills the GPU; the
    table's single-k calls on [G, n] rewards read one k's bank where the estimator has one)."""
    from bonkernels import estimators, tables
    from bonkernels.triton import _config  # pure Python: imports no triton

    est = estimators.get(estimator)
    return _config.estimator_lanes_up_to(est, has_bank=est.name in tables.BANK_ESTIMATORS)


def _generic_lane_max_block() -> int:
    """The largest block at which the A/B cell triton-generic takes lanes: the kernel with every
    estimator in lanes, as the estimators' own kernels up to 32 (the centred ones, and maxk,
    passk and maxk_loo1 from a bank, go to 64 in their own only)."""
    from bonkernels.triton import _config

    return _config.OWN_KERNEL_LANE_MAX_BLOCK


def bandwidth_cell_runs(backend: str, estimator: str, n: int) -> bool:
    """Whether the bandwidth table times an A/B cell: triton-spread only where triton takes lanes
    (elsewhere it is triton's own launch); triton-generic everywhere but in (the kernel with every
    estimator's last lane block, the estimator's own], where it would take lanes that no launch
    takes."""
    if backend == SPREAD:
        return n <= _lane_max_block(estimator)
    if backend == GENERIC:
        return not _generic_lane_max_block() < n <= _lane_max_block(estimator)
    return True


def make_call(backend: str, estimator: str, G: int, n: int, device: str, seed: int = 0):
    """(call, bytes moved per call) for one cell; the inputs live on ``device``."""
    import bonkernels as bk

    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(G, n, generator=g).to(device)
    kwargs = dict(check_inputs=False, max_group_size=n, backend=backend)
    nbytes = 8 * G * n
    if estimator == "maxk_offpolicy":
        kwargs.update(deltas=((torch.rand(G, n, generator=g) - 0.5) * 0.2).to(device), clamp_delta=CLAMP_DELTA)
        nbytes += 4 * G * n
    k = None if estimator == "grpo" else K
    if backend.startswith(PLAN):  # the same call prepared once (bk.prepare_advantages)
        plan = bk.prepare_advantages(k, estimator, group_size=n, backend=backend[len(PLAN):],
                                     clamp_delta=kwargs.get("clamp_delta"), device=device)
        deltas = kwargs.get("deltas")
        return (lambda: plan(rewards, deltas)), nbytes
    if backend in LANE_AB:
        kwargs["backend"] = "triton"
        layout = spread_layout if backend == SPREAD else generic_kernel

        def lane_ab_call():
            with layout():
                return bk.advantages(rewards, k, estimator, **kwargs)
        return lane_ab_call, nbytes

    def call():
        return bk.advantages(rewards, k, estimator, **kwargs)
    return call, nbytes


class Clock:
    """CUDA events with L2 flushes on a GPU, perf_counter on the CPU (dry run)."""

    def __init__(self, device: str):
        self.cuda = device != "cpu"
        self.timer = timing.CudaTimer(torch.device(device)) if self.cuda else None

    def seconds(self, fn) -> float:
        if self.cuda:
            return self.timer.time(fn, target_s=0.2).median_s
        return timing.time_cpu(fn, target_s=0.05, min_reps=3, max_reps=50, probe_memory_below_s=0.0).median_s

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def bandwidth_rows(backends, clock: Clock, device: str, n_samples: int, ns, log) -> list[dict]:
    rows = []
    for n in ns:
        G = max(1, n_samples // n)
        src = torch.rand(G, n, device=device)
        dst = torch.empty_like(src)
        copy_s = clock.seconds(lambda: dst.copy_(src))
        copy_bps = 8 * G * n / copy_s
        del src, dst
        for backend in backends:
            for est in ESTIMATORS:
                if not bandwidth_cell_runs(backend, est, n):
                    continue
                call, nbytes = make_call(backend, est, G, n, device)
                try:
                    s = clock.seconds(call)
                except (RuntimeError, ValueError) as error:  # e.g. a backend that cannot take n
                    log(f"[gpu_limits] {backend} {est} n={n}: {error}")
                    continue
                rate = nbytes / s
                rows.append({"backend": backend, "estimator": est, "G": G, "n": n, "time_us": s * 1e6,
                             "GBps": rate / 1e9, "copy_GBps": copy_bps / 1e9, "fraction_of_copy": rate / copy_bps})
                log(f"[gpu_limits] {backend} {est} G={G} n={n}: {s * 1e6:,.1f} us, {rate / 1e9:,.0f} GB/s "
                    f"= {rate / copy_bps:.0%} of copy")
    return rows


def kernel_seconds(call, reps: int = 20) -> float:
    """The sum of one call's CUDA kernel durations (median over reps), by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    per_kernel = [e.device_time_total for e in prof.key_averages() if e.device_time_total > 0]
    return sum(per_kernel) / reps / 1e6


def small_batch_rows(backends, clock: Clock, device: str, G: int, n: int, calls: int, log) -> list[dict]:
    rows = []
    # The floor of a call from Python: one torch op of one kernel on the same bytes (out.copy_).
    src = torch.rand(G, n, device=device)
    dst = torch.empty_like(src)
    cells = [("torch", "copy_ (one launch)", lambda: dst.copy_(src))]
    plans = [PLAN + b for b in backends if b not in LANE_AB]
    # (G = 1024 takes no lanes: triton-spread is triton there, and triton-generic the A/B of the
    # spread layout's kernel compiled per estimator)
    for backend in (*[b for b in backends if b != SPREAD], *plans):
        for est in ESTIMATORS:
            cells.append((backend, est, make_call(backend, est, G, n, device)[0]))
    for backend, est, call in cells:
        try:
            call()
        except (RuntimeError, ValueError) as error:
            log(f"[gpu_limits] {backend} {est} small batch: {error}")
            continue
        clock.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        clock.sync()
        wall = (time.perf_counter() - t0) / calls
        row = {"backend": backend, "estimator": est, "G": G, "n": n, "wall_us": wall * 1e6,
               "kernel_us": None, "graph_replay_us": None}
        if clock.cuda:
            row["kernel_us"] = kernel_seconds(call) * 1e6
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(100):
                    call()
            graph.replay()
            torch.cuda.synchronize()
            row["graph_replay_us"] = statistics.median(_replay_seconds(graph) for _ in range(5)) / 100 * 1e6
        rows.append(row)
        log(f"[gpu_limits] {backend} {est} G={G} n={n}: wall {row['wall_us']:.1f} us/call, kernels "
            f"{row['kernel_us']} us, graph replay {row['graph_replay_us']} us/call")
    return rows


CROSSOVER_GS = (1024, 4096, 16384, 65536, 262144)


def crossover_rows(backends, clock: Clock, device: str, Gs, n: int, log) -> list[dict]:
    """Kernel time per call against the batch size at one group size: where the thread-per-group
    layout (triton) overtakes the spread one (triton-spread), which wins on small batches."""
    rows = []
    for G in Gs:
        for backend in backends:
            for est in ("maxk_loo1", "grpo"):
                call, _ = make_call(backend, est, G, n, device)
                call()
                seconds = kernel_seconds(call) if clock.cuda else clock.seconds(call)
                rows.append({"backend": backend, "estimator": est, "G": G, "n": n, "kernel_us": seconds * 1e6})
                log(f"[gpu_limits] crossover {backend} {est} G={G} n={n}: {seconds * 1e6:.1f} us")
    return rows


def _replay_seconds(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def verdicts(bandwidth: list[dict], small: list[dict]) -> list[str]:
    lines = []
    for r in bandwidth:
        if r["n"] == 16 and r["backend"] in TARGET_FRACTION:
            want = TARGET_FRACTION[r["backend"]]
            lines.append(f"{r['backend']} {r['estimator']} N = {r['G'] * r['n']:,} n = 16: {r['fraction_of_copy']:.0%} "
                         f"of copy (target {want:.0%}): {'met' if r['fraction_of_copy'] >= want else 'NOT met'}")
    for r in small:
        if r["kernel_us"] is not None and r["backend"].removeprefix(PLAN) in TARGET_FRACTION:
            ok = r["kernel_us"] < TARGET_KERNEL_US and r["wall_us"] < TARGET_WALL_US
            lines.append(f"{r['backend']} {r['estimator']} G = {r['G']} n = {r['n']}: kernels {r['kernel_us']:.1f} us "
                         f"(< {TARGET_KERNEL_US:g}), wall {r['wall_us']:.1f} us (< {TARGET_WALL_US:g}): "
                         f"{'met' if ok else 'NOT met'}")
    return lines


def report(meta: dict, bandwidth: list[dict], small: list[dict], crossover: list[dict] = ()) -> str:
    md = [f"# GPU limits ({meta['date_utc']})", "", f"`python -m bench.gpu_limits {meta['options']}` on "
          f"{meta.get('gpu', meta.get('host_cpu', '?'))}, torch {meta.get('torch', '?')}.", "",
          "| backend | estimator | G | n | time us | GB/s | copy GB/s | of copy |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['backend']} | {r['estimator']} | {r['G']:,} | {r['n']} | {r['time_us']:,.1f} | {r['GBps']:,.0f} | "
           f"{r['copy_GBps']:,.0f} | {r['fraction_of_copy']:.0%} |" for r in bandwidth]
    md += ["", "| backend | estimator | G | n | wall us/call | kernels us/call | graph replay us/call |",
           "|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    md += [f"| {r['backend']} | {r['estimator']} | {r['G']} | {r['n']} | {fmt(r['wall_us'])} | {fmt(r['kernel_us'])} | "
           f"{fmt(r['graph_replay_us'])} |" for r in small]
    if crossover:
        md += ["", "| backend | estimator | G | n | kernels us/call |", "|---|---|---|---|---|"]
        md += [f"| {r['backend']} | {r['estimator']} | {r['G']:,} | {r['n']} | {r['kernel_us']:.1f} |" for r in crossover]
    md += ["", "Targets:", ""] + [f"* {line}" for line in verdicts(bandwidth, small)] + [""]
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="the CPU kernel, tiny sizes: checks the flow (CI)")
    ap.add_argument("--backends", help=f"a subset, e.g. cuda (default: cuda,triton,{SPREAD},{GENERIC})")
    ap.add_argument("--ns", help="group sizes of the bandwidth cells, e.g. 8,16,32 (default: all)")
    ap.add_argument("--no-crossover", action="store_true",
                    help="skip the kernel time against G at n = 16 (triton and triton-spread)")
    a = ap.parse_args(argv)
    if a.dry_run:
        device, backends, n_samples, ns, small_calls = "cpu", ("cpu",), 1 << 12, (8, 16, 64), 20
    else:
        if not torch.cuda.is_available():
            print("[gpu_limits] no CUDA device (use --dry-run on a CPU machine)", file=sys.stderr)
            return 2
        device, backends, n_samples, ns, small_calls = "cuda", ("cuda", "triton", SPREAD, GENERIC), 1 << 24, NS, 1000
    if a.backends:  # a quick A/B run of two builds needs only some cells
        backends = tuple(b for b in a.backends.split(",") if b)
    if a.ns:
        ns = tuple(int(n) for n in a.ns.split(",") if n)
    os.makedirs(a.out, exist_ok=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    clock = Clock(device)
    bandwidth = bandwidth_rows(backends, clock, device, n_samples, ns, log)
    small = small_batch_rows(backends, clock, device, 1024 if not a.dry_run else 64, 16, small_calls, log)
    crossover = []
    if not a.no_crossover:
        pair = [b for b in backends if b in ("triton", SPREAD)] if device == "cuda" else list(backends)
        Gs = CROSSOVER_GS if device == "cuda" else (16, 64)
        crossover = crossover_rows(pair, clock, device, Gs, 16, log) if pair else []
    meta = environment.describe(torch.device(device), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    meta.update(date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                options=" ".join(sys.argv[1:] if argv is None else argv), torch=torch.__version__)
    if device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    with open(os.path.join(a.out, "gpu_limits.json"), "w") as f:
        json.dump({"meta": meta, "bandwidth": bandwidth, "small_batch": small, "crossover": crossover}, f,
                  indent=1)
    text = report(meta, bandwidth, small, crossover)
    with open(os.path.join(a.out, "REPORT.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
