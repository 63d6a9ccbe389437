"""Timers, peak-memory probes and the copy bandwidth that bounds every kernel.

CPU: ``time.perf_counter`` around each call; peak memory is the process's resident-set high-water
mark (VmHWM, reset through ``/proc/self/clear_refs``) minus the resident set before the call, taken
in a separate call with glibc set to give every buffer above 128 KiB fresh pages, so it counts
what the call allocates at its peak: tensors, allocator slack and Python objects.
GPU: CUDA events around each call with the L2 cache flushed before every repetition; peak memory is
``torch.cuda.max_memory_allocated`` minus what was allocated before the call.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    median_s: float
    reps: int
    min_s: float
    max_s: float
    first_call_s: float  # the warm-up call: includes one-time costs (JIT, caches)
    peak_mem_bytes: int | None = None


def _plan_reps(estimate_s: float, target_s: float, min_reps: int, max_reps: int) -> int:
    if estimate_s <= 0:
        return max_reps
    return int(min(max_reps, max(min_reps, target_s / estimate_s)))


# ----------------------------------------------------------------------------------------------
# CPU
# ----------------------------------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def configure_malloc_for_timing() -> bool:
    """Pin glibc's allocator to its steady state for the whole run (the memory probe changes it).

    glibc starts with a 128 KiB mmap threshold and raises it (up to 32 MiB) as large buffers are
    freed; the probe must set it, which switches that adaptation off, so fix it at the adapted
    value from the start: buffers up to 32 MiB are reused from the heap, as in a warmed-up process.
    Returns whether the setting applied (False off glibc).
    """
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20))


class _FreshPages:
    """During the probe: every buffer above 128 KiB gets fresh pages (mmap), and free heap memory
    goes back to the OS first, so the high-water mark sees each buffer the call allocates."""

    def __enter__(self):
        self.libc = _libc()
        if self.libc is not None:
            self.libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
            self.libc.mallopt(_M_TRIM_THRESHOLD, 128 << 10)
            self.libc.malloc_trim(0)
        return self

    def __exit__(self, *exc):
        if self.libc is not None:
            self.libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
            self.libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
        return False


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_rss_bytes(fn) -> int | None:
    """Resident memory a call adds at its peak (bytes), or None where the probe is unavailable."""
    gc.collect()
    with _FreshPages():
        try:
            before = _status_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except (OSError, RuntimeError):
            return None
        out = fn()
        peak = _status_kib("VmHWM")
        del out
    return max(0, peak - before) * 1024


def time_cpu(fn, *, target_s: float = 0.25, min_reps: int = 5, max_reps: int = 200,
             slow_call_s: float = 0.5, slow_min_reps: int = 3, very_slow_s: float = 5.0,
             probe_memory_below_s: float = 2.0) -> Timing:
    """Warm up, then the median of many calls (at least ``slow_min_reps`` for slow calls).

    Fast calls get two warm-ups (the first can pay one-time costs), a slow call one, and a call
    slower than ``very_slow_s`` (a Python loop: no one-time cost worth a warm-up) counts its first
    run as a repetition. The memory probe is one more call, after the timed ones, for calls
    faster than ``probe_memory_below_s``.
    """
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    slow = first > slow_call_s
    if slow:
        estimate = first
    else:
        t0 = time.perf_counter()
        fn()
        estimate = time.perf_counter() - t0
    reps = _plan_reps(estimate, target_s, slow_min_reps if slow else min_reps, max_reps)
    times = []
    if first > very_slow_s:
        times.append(first)
        reps = max(1, slow_min_reps - 1)
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    if not slow:
        times.append(estimate)
    median = statistics.median(times)
    peak = peak_rss_bytes(fn) if median < probe_memory_below_s else None
    return Timing(median, len(times), min(times), max(times), first, peak)


def copy_bandwidth_cpu(nbytes: int = 256 << 20, reps: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` (read + write counted), in the current thread setting."""
    n = nbytes // 4
    src = torch.rand(n)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(times)


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------

class CudaTimer:
    """CUDA-event timing with an L2 flush before each repetition (as triton.testing.do_bench)."""

    def __init__(self, device: torch.device, flush_bytes: int = 512 << 20):
        self.device = device
        self.flush = torch.empty(flush_bytes, dtype=torch.int8, device=device)

    def time(self, fn, *, target_s: float = 0.2, min_reps: int = 10, max_reps: int = 500,
             slow_call_s: float = 0.1, slow_min_reps: int = 3) -> Timing:
        sync = torch.cuda.synchronize
        t0 = time.perf_counter()
        fn()
        sync()
        first = time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush.zero_()
        start.record()
        fn()
        end.record()
        sync()
        estimate = start.elapsed_time(end) / 1e3
        lo = slow_min_reps if estimate > slow_call_s else min_reps
        reps = _plan_reps(estimate, target_s, lo, max_reps)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        sync()
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)] + [estimate]
        return Timing(statistics.median(times), len(times), min(times), max(times), first)


def peak_cuda_bytes(fn, device: torch.device) -> int:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return max(0, peak - before)


def copy_bandwidth_cuda(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize(device)
    t = statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))
    del src, dst
    return 2 * n * 4 / t
