"""Run untrusted Python in a separate, isolated, resource-limited process.

``run_sandboxed(code)`` starts ``python -I -S _sandbox_child.py`` in a new session, with a clean
environment and a fresh temporary directory as its working directory, feeds it the program on
stdin, and waits at most ``timeout`` seconds of wall-clock time; then it kills the whole process
group (and, through the PID namespace, everything the program started). What the child does to
isolate itself (network/PID/mount namespaces, user nobody, rlimits) is described in
``_sandbox_child.py``; ``SandboxResult.layers`` says which layers were active for a run.

stdout and stderr go to files in the parent's temporary directory, so RLIMIT_FSIZE also bounds
how much a program can print. Nothing the program does can raise in the caller: every outcome is
a SandboxResult.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_child.py")


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed for the timeout
    stdout: str
    stderr: str
    timed_out: bool
    layers: tuple[str, ...]
    seconds: float


def run_sandboxed(code: str, *, timeout: float = 5.0, memory_bytes: int = 1 << 30,
                  file_bytes: int = 1 << 20, nproc: int = 64, open_files: int = 64,
                  output_chars: int = 100_000) -> SandboxResult:
    """Run Python source ``code`` in the sandbox and return what happened."""
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    request = json.dumps({
        "code": code,
        "cpu_seconds": max(1, int(timeout) + 1),
        "memory_bytes": int(memory_bytes),
        "file_bytes": int(file_bytes),
        "nproc": int(nproc),
        "open_files": int(open_files),
    })
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bk-sandbox-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _CHILD],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=tmp, env=env,
                start_new_session=True, close_fds=True,
            )
            timed_out = False
            try:
                proc.stdin.write(request.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            # Always kill the group: a finished child may have left processes behind.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        stdout = _read_text(out_path, output_chars)
        stderr = _read_text(err_path, output_chars)
    layers = ()
    for line in stderr.splitlines():
        if line.startswith("BK_SANDBOX_LAYERS="):
            layers = tuple(x for x in line.split("=", 1)[1].split(",") if x)
            break
    return SandboxResult(
        returncode=None if timed_out else proc.returncode,
        stdout=stdout, stderr=stderr, timed_out=timed_out, layers=layers,
        seconds=time.monotonic() - start,
    )


def _read_text(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")
