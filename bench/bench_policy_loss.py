"""Forward + backward of bk.policy_loss against the same loss in plain, unfused PyTorch.

    .venv/bin/python bench/bench_policy_loss.py [--B 64] [--T 4096] [--repeats 20] [--threads 2]

Prints, per implementation, the median wall time of one forward + backward (after warm-up) and
the peak extra memory one step needs beyond its inputs. Times come from one process where the
implementations take turns. Memory comes from a fresh subprocess per implementation: on CPU the
growth of the process's peak RSS (high-water mark reset just before the step, with a fixed malloc
mmap threshold so freed tensors leave the RSS), on CUDA torch's peak allocated memory.

Implementations:
* ``plain``: the loss as trainers write it (TRL / verl style): ratio, clipped surrogate, masked
  token mean, autograd through every op.
* ``bk-torch``: bk.policy_loss(backend="torch"), the library's plain PyTorch reference.
* ``bk-fused``: bk.policy_loss(backend="auto"): the chunked fused path on CPU, Triton on CUDA.
All three compute the same maxk_loo1 advantages (k = 4, groups of 16) with bonkernels.advantages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLEMENTATIONS = ("plain", "bk-torch", "bk-fused")
GROUP, K = 16, 4


def _inputs(B, T, device):
    import torch
    g = torch.Generator().manual_seed(0)
    logp = (-1.0 + 0.5 * torch.randn(B, T, generator=g)).to(device)
    old = (logp.cpu() + 0.1 * torch.randn(B, T, generator=g)).to(device)
    mask = (torch.rand(B, T, generator=g) > 0.1).to(device)
    rewards = torch.rand(B, generator=g).to(device)
    return logp, old, mask, rewards


def _plain_loss(logp, old, mask, rewards, clip=0.2):
    import torch
    import bonkernels as bk
    adv = bk.advantages(rewards.view(-1, GROUP), K, "maxk_loo1").reshape(-1, 1)
    ratio = torch.exp(logp - old)
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    m = mask.to(logp.dtype)
    return (per_token * m).sum() / m.sum()


def _step(name, logp, old, mask, rewards):
    from bonkernels.loss import policy_loss
    x = logp.detach().requires_grad_()
    if name == "plain":
        loss = _plain_loss(x, old, mask, rewards)
    else:
        backend = "torch" if name == "bk-torch" else "auto"
        loss, _ = policy_loss(x, old, rewards, K, "maxk_loo1", mask=mask, group_size=GROUP, backend=backend)
    loss.backward()
    return loss.detach(), x.grad


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _cpu_peak_extra_bytes(fn) -> int:
    """Peak RSS growth while fn runs: reset the high-water mark (clear_refs 5), run, read VmHWM.

    The parent sets MALLOC_MMAP_THRESHOLD_ so every tensor-sized block is its own mapping and goes
    back to the OS when freed; RSS then follows the live tensors.
    """
    import gc
    gc.collect()
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    out = fn()
    peak = _status_kib("VmHWM")
    del out
    return (peak - base) * 1024


def measure_memory(name, B, T, threads, device):
    """Runs in a fresh process: the peak extra memory of one forward + backward."""
    import torch
    torch.set_num_threads(threads)
    logp, old, mask, rewards = _inputs(B, T, device)
    for _ in range(2):
        _step(name, logp, old, mask, rewards)   # warm-up (lazy init, Triton JIT) before measuring
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = _step(name, logp, old, mask, rewards)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak
    return _cpu_peak_extra_bytes(lambda: _step(name, logp, old, mask, rewards))


def measure_times(B, T, repeats, threads, device):
    """Runs in one process with the default allocator: the implementations take turns, so a
    change in the machine's load hits all of them alike."""
    import torch
    torch.set_num_threads(threads)
    logp, old, mask, rewards = _inputs(B, T, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for name in IMPLEMENTATIONS:
        for _ in range(3):
            _step(name, logp, old, mask, rewards)
    sync()
    times = {name: [] for name in IMPLEMENTATIONS}
    for _ in range(repeats):
        for name in IMPLEMENTATIONS:
            t0 = time.perf_counter()
            _step(name, logp, old, mask, rewards)
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: {"median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t)} for name, t in times.items()}


def check_same(B, T, device):
    """All implementations agree (float32) before anything is timed."""
    import torch
    logp, old, mask, rewards = _inputs(B, T, device)
    ref_loss, ref_grad = _step("plain", logp, old, mask, rewards)
    for name in IMPLEMENTATIONS[1:]:
        loss, grad = _step(name, logp, old, mask, rewards)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps({"peak_bytes": measure_memory(args.one, args.B, args.T, args.threads, args.device)}))
        return
    sys.path.insert(0, REPO)
    check_same(min(args.B, 16), min(args.T, 256), args.device)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_MMAP_THRESHOLD_="65536")
    times = measure_times(args.B, args.T, args.repeats, args.threads, args.device)
    rows = []
    for name in IMPLEMENTATIONS:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--B", str(args.B), "--T", str(args.T),
               "--threads", str(args.threads), "--device", args.device]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        peak = json.loads(out.strip().splitlines()[-1])["peak_bytes"]
        rows.append(dict(name=name, peak_extra_mib=peak / 2**20, **times[name]))
    plain = rows[0]
    print(f"policy loss forward+backward, B x T = {args.B} x {args.T}, float32, {args.device}, "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"{'implementation':<12} {'median ms':>10} {'min ms':>8} {'median/plain':>13} {'min/plain':>10} "
          f"{'peak extra MiB':>15}")
    for r in rows:
        print(f"{r['name']:<12} {r['median_ms']:>10.2f} {r['min_ms']:>8.2f} {r['median_ms'] / plain['median_ms']:>13.2f} "
              f"{r['min_ms'] / plain['min_ms']:>10.2f} {r['peak_extra_mib']:>15.1f}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (on {os.cpu_count()} CPUs)")

if __name__ == "__main__":
    main()
