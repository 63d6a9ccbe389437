"""The sandbox against hostile programs: each must end with reward 0 (or a failed run) and leave the
trainer, its files, its secrets and the machine untouched."""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from bonkernels.train.sandbox import run_sandboxed

IS_ROOT = os.geteuid() == 0
# Without root the sandbox has only rlimits, a socket audit hook and the process-group kill: it
# runs as the trainer's own user, so file, signal and /proc isolation cannot hold there.
needs_root = pytest.mark.skipif(not IS_ROOT, reason="namespaces and the uid switch need root")


def _marker_processes(marker):
    """Pids of live processes whose command line or environment mentions marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            found.append(int(pid))
    return found


def test_ordinary_program_runs_and_prints():
    r = run_sandboxed("print(sum(range(10)))", timeout=5)
    assert r.returncode == 0 and r.stdout.strip() == "45" and not r.timed_out


def test_reports_its_isolation_layers():
    r = run_sandboxed("pass")
    assert "rlimits" in r.layers
    if IS_ROOT:
        assert {"netns", "pidns", "uid-nobody"} <= set(r.layers)
    else:
        assert "socket-audit-hook" in r.layers


def test_infinite_loop_is_killed_on_time():
    r = run_sandboxed("while True:\n    pass\n", timeout=1.0)
    assert r.timed_out and r.returncode is None
    assert r.seconds < 5


def test_memory_bomb_fails_without_harm():
    r = run_sandboxed("x = bytearray(8 << 30)\nprint('allocated')", timeout=5,
                      memory_bytes=512 << 20)
    assert "allocated" not in r.stdout
    assert r.returncode != 0 or r.timed_out


@needs_root
def test_fork_bomb_is_contained_and_fully_cleaned_up():
    marker = "bkforkbomb" + uuid.uuid4().hex[:8]
    # every process renames itself to carry the marker so we can look for survivors
    code = (
        "import os, ctypes\n"
        f"ctypes.CDLL(None).prctl(15, b'{marker[:15]}', 0, 0, 0)\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"  # try to escape the process group
        "    except OSError:\n"
        "        pass\n"
    )
    before = time.monotonic()
    r = run_sandboxed(code, timeout=1.5, nproc=32)
    assert r.timed_out
    assert time.monotonic() - before < 10
    # prctl(PR_SET_NAME) changes /proc/pid/comm, not cmdline: check comm too
    deadline = time.monotonic() + 3
    while True:
        alive = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().strip() == marker[:15]:
                            alive.append(pid)
                except OSError:
                    pass
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert alive == [], f"fork bomb survivors: {alive}"


@needs_root
def test_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "owned.txt"
    target.write_text("original")
    host_tmp_name = f"/tmp/bk-sandbox-escape-{uuid.uuid4().hex}"
    code = (
        "import os\n"
        "ok = []\n"
        f"for path in [{str(target)!r}, {host_tmp_name!r}, '/work/bk_escape.txt', '../escape.txt']:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('pwned')\n"
        "        ok.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('WROTE', ok)\n"
    )
    r = run_sandboxed(code, timeout=5)
    assert target.read_text() == "original"
    assert not os.path.exists(host_tmp_name)
    assert not os.path.exists("/work/bk_escape.txt")
    assert not os.path.exists(os.path.join(os.path.dirname(os.getcwd()), "escape.txt"))
    assert "WROTE" in r.stdout  # it ran; writes to its private /tmp are allowed and vanish


def test_file_size_limit():
    r = run_sandboxed("with open('big', 'wb') as f:\n    f.write(b'x' * (8 << 20))\nprint('done')",
                      timeout=5, file_bytes=1 << 20)
    assert "done" not in r.stdout and r.returncode != 0


@needs_root
def test_environment_secrets_do_not_leak(monkeypatch, tmp_path):
    secret = "bk-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("BK_TEST_SECRET", secret)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    os.chmod(secret_file, 0o600)
    code = (
        "import os\n"
        "print(dict(os.environ))\n"
        f"for path in ['/proc/{os.getpid()}/environ', '/proc/1/environ', {str(secret_file)!r}]:\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError as e:\n"
        "        print('denied', path)\n"
    )
    r = run_sandboxed(code, timeout=5)
    assert r.returncode == 0
    assert secret not in r.stdout and secret not in r.stderr
    assert "BK_TEST_SECRET" not in r.stdout


def test_no_network():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(4)
    port = server.getsockname()[1]
    connected = []

    def accept():
        try:
            conn, _ = server.accept()
            connected.append(True)
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__)\n"
    )
    r = run_sandboxed(code, timeout=5)
    thread.join()
    server.close()
    assert connected == []
    assert "CONNECTED" not in r.stdout


@needs_root
def test_cannot_kill_its_parent_or_other_processes():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = (
            "import os, signal\n"
            f"for pid in [{victim.pid}, {os.getpid()}, os.getppid()]:\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print('killed', pid)\n"
            "    except (OSError, ValueError) as e:\n"
            "        print('refused', pid, type(e).__name__)\n"
            "try:\n"
            "    os.killpg(0, signal.SIGKILL)\n"
            "except OSError:\n"
            "    pass\n"
        )
        r = run_sandboxed(code, timeout=5)
        time.sleep(0.2)
        assert victim.poll() is None, "the sandboxed program killed another process"
        assert r is not None
    finally:
        victim.kill()
        victim.wait()


@needs_root
def test_survivors_of_a_finished_program_are_killed():
    marker = "bksurvivor" + uuid.uuid4().hex[:8]
    code = (
        "import os, subprocess\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 30; echo {marker}'], start_new_session=True)\n"
        "print('parent done')\n"
    )
    r = run_sandboxed(code, timeout=5)
    assert "parent done" in r.stdout
    time.sleep(0.3)
    assert _marker_processes(marker) == []


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)", "raise RuntimeError('boom')",
                                  "import os; os.abort()", "def f(): f()\nf()"])
def test_crashes_are_reported_not_raised(code):
    r = run_sandboxed(code, timeout=5)
    assert r.returncode not in (0, None) and not r.timed_out
