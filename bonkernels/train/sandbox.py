"""Run untrusted Python in an isolated, resource-limited process tree.

``run_sandboxed(code)`` starts ``python -I -S _sandbox_child.py`` (the trusted runner) in a new
session, with a clean environment, a fresh temporary directory and a private result pipe. As
root the runner puts the program in its own mount, PID, network, IPC and UTS namespaces under a
trusted init (PID 1), with its own read-only root file system and private /tmp, as user nobody,
with no new privileges, resource limits and a system-call filter (details in
``_sandbox_child.py``). After ``timeout``
seconds of wall-clock time the runner is told to kill the init, which makes the kernel kill the
whole PID namespace; ``run_sandboxed`` returns only once it is empty.

With ``tests`` the program is a completion that is never run as a whole: the trusted init
loads it in the program process and drives the hidden tests from its own interpreter through a
plain-data protocol (``_sandbox_program.py``), and the pass counts come back on the result pipe,
which no untrusted process holds. Nothing printed by the program is ever parsed.

``SandboxResult.layers`` (from the trusted channel) says which isolation layers were active.
``isolation_layers()`` probes them once; ``FULL_ISOLATION`` is what a root run provides. Nothing
the program does can raise in the caller: every outcome is a SandboxResult.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

_HERE = os.path.dirname(os.path.abspath(__file__))
_CHILD = os.path.join(_HERE, "_sandbox_child.py")
_PROGRAM = os.path.join(_HERE, "_sandbox_program.py")

# The layers a run with root and namespaces has; anything less is reported as reduced isolation.
# (The system-call filter is written for x86_64; elsewhere it is absent and not required.)
FULL_ISOLATION = ("mountns", "pidns", "netns", "ipcns", "utsns", "own-root", "readonly-system",
                  "private-tmp", "private-proc", "uid-nobody", "no-new-privs", "rlimits") + (
                  ("seccomp",) if platform.machine() == "x86_64" else ())


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed for the timeout
    stdout: str
    stderr: str
    timed_out: bool
    layers: tuple[str, ...]
    seconds: float
    tests: dict | None = None  # the test driver's counts (from the trusted channel)
    error: str | None = None  # why the trusted side could not report, if it could not
    trusted: dict = field(default_factory=dict)  # everything the trusted channel said


@dataclass(frozen=True)
class HiddenTests:
    """Hidden tests run by the trusted driver against a completion's function ``entry``.

    ``prelude`` (trusted, e.g. the task's prompt) and ``test`` (with ``check(candidate)`` and every
    assertion reported through ``__bk_record(ok)``) run in the driver; ``candidate`` calls the
    program's ``entry`` through the protocol.
    """

    prelude: str
    test: str
    entry: str
    check: str = "check"
    call_timeout: float = 1.0
    max_restarts: int = 2


def run_sandboxed(code: str, *, timeout: float = 5.0, memory_bytes: int = 1 << 30,
                  file_bytes: int = 1 << 20, nproc: int = 64, open_files: int = 64,
                  tmp_bytes: int = 64 << 20, output_chars: int = 100_000,
                  tests: HiddenTests | None = None, isolate: bool = True) -> SandboxResult:
    """Run Python source ``code`` in the sandbox (or drive ``tests`` against it)."""
    if not timeout > 0:
        raise ValueError("timeout must be positive")
    result_r, result_w = os.pipe()
    request = {
        "code": code, "timeout": float(timeout), "result_fd": result_w, "isolate": bool(isolate),
        "program_path": _PROGRAM, "cpu_seconds": max(1, int(timeout) + 1),
        "memory_bytes": int(memory_bytes), "file_bytes": int(file_bytes), "nproc": int(nproc),
        "open_files": int(open_files), "tmp_bytes": int(tmp_bytes),
        "tests": None if tests is None else {
            "code": code, "prelude": tests.prelude, "test": tests.test, "entry": tests.entry,
            "check": tests.check, "call_timeout": tests.call_timeout,
            "max_restarts": tests.max_restarts},
    }
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bk-sandbox-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", _CHILD], stdin=subprocess.PIPE, stdout=out,
                    stderr=err, cwd=tmp, env=env, start_new_session=True, pass_fds=(result_w,))
        finally:
            os.close(result_w)
        os.set_blocking(result_r, False)  # never wait on it: the reports fit in the pipe's buffer
        with os.fdopen(result_r, "rb") as results:
            timed_out = _feed_and_wait(proc, json.dumps(request).encode(), timeout)
            trusted_text = (results.read(1 << 20) or b"").decode("utf-8", errors="replace")
        stdout = _read_text(out_path, output_chars)
        stderr = _read_text(err_path, output_chars)
    trusted = {}
    for line in trusted_text.splitlines():
        try:
            trusted.update(json.loads(line))
        except ValueError:
            pass
    returncode = None if timed_out else proc.returncode
    if "exit" in trusted and not timed_out:
        returncode = trusted["exit"]
    return SandboxResult(
        returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
        layers=tuple(trusted.get("layers", ())), seconds=time.monotonic() - start,
        tests=None if timed_out else trusted.get("tests"), error=trusted.get("error"),
        trusted=trusted)


def _feed_and_wait(proc, request: bytes, timeout: float) -> bool:
    """Send the request, wait; at the deadline have the runner kill the namespace. Timed out?"""
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # the runner SIGKILLs the init and waits for the namespace
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    # Always kill the group: without namespaces a finished program may have left processes behind.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def _read_text(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=None)
def isolation_layers() -> tuple[str, ...]:
    """The layers a sandboxed run gets on this machine (probed once)."""
    return run_sandboxed("pass", timeout=10).layers


def missing_layers() -> tuple[str, ...]:
    have = set(isolation_layers())
    return tuple(layer for layer in FULL_ISOLATION if layer not in have)
