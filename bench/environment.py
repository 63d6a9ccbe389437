"""The facts a benchmark result is meaningless without: machine, versions, date, load."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit(repo: str) -> str:
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            return "unknown"
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception as e:  # report, never fail, on a broken optional dependency
        return f"not importable ({type(e).__name__})"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def describe(device: torch.device, repo: str) -> dict:
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host_cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "bonkernels_commit": _git_commit(repo),
        "load_average_start": load_average(),
        "device": device.type,
    }
    try:
        import bonkernels._native as native  # noqa: F401
        info["native_extension"] = "available" if native.available() else "not built"
    except Exception as e:
        info["native_extension"] = f"not importable ({type(e).__name__})"
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info["gpu"] = p.name
        info["gpu_memory_GiB"] = round(p.total_memory / 2**30, 1)
        info["cuda_runtime"] = torch.version.cuda
    return info
