"""The trusted side of the sandbox, started by ``sandbox.py`` as ``python -I -S`` (stdlib only).

It reads one JSON request on stdin (see ``sandbox.run_sandboxed``) and writes what it knows for
sure to the result pipe (fd ``result_fd``, which no untrusted process holds): one JSON line with
the active isolation layers, then one with the outcome. Three processes:

* the runner (this process, root, on the host's PID namespace): ``unshare`` of new mount, PID,
  network, IPC and UTS namespaces, then it forks the init and waits for it. SIGTERM from the
  caller (the wall-clock kill) makes it SIGKILL the init and wait until the whole namespace is
  gone. Its parent-death signal is SIGKILL, so a dead trainer takes it down too.
* the init (PID 1 of the new PID namespace, stays root, trusted): builds the program's file
  system (below), starts the program, and then either waits for it or drives the hidden tests.
  When the init exits or is killed, the kernel kills every process of the namespace: the program
  never guards its own lifetime (a ``setsid`` + ``PR_SET_PDEATHSIG, 0`` + fork does not help it).
* the program: a fresh ``execve`` of the interpreter (``_sandbox_program.py``) as user nobody
  with no new privileges, resource limits (CPU, address space, file size, processes, open
  files, no core) and, on x86_64, a seccomp filter (``_seccomp_program``: no new namespaces,
  no ptrace, bpf, io_uring, keyctl, perf events, userfaultfd or mount calls, no other ABI).
  Its stdin is /dev/null, stdout/stderr the caller's capture files; fds 3 and 4 are its
  protocol pipes to the init.

The program's root file system (built by the init in a mount namespace of its own, so the runner
keeps the host's view) is a fresh tmpfs holding read-only bind
mounts of /usr, /etc and the interpreter's prefix (plus the /bin, /lib... links), a minimal /dev
(null, zero, full, random, urandom), a /proc of its own PID namespace mounted with hidepid=2 and
a private, size-limited tmpfs /tmp (its working directory is /tmp/work): the only writable place.
The host's /tmp, /run, /var, /home, /root, the repository... are absent, so no host Unix socket
(pathname ones live there; abstract ones belong to the host's network namespace) can be reached,
and System V IPC objects live and die with the IPC namespace.

Without root (or with ``isolate`` false, or where ``unshare`` is refused) the runner itself plays
the init without namespaces: the program gets rlimits, a socket audit hook and the caller's
process-group kill, and runs as the trainer's user. The layers reported say so.

Test driver ("tests" in the request): the init runs the trusted prelude (the task's prompt) and
the instrumented test in its own interpreter, with ``candidate`` a proxy that sends each call's
arguments to the program and decodes the plain-data answer (``_sandbox_program.py``). A call that
does not answer within ``call_timeout`` seconds counts as failed; the program is then killed and
restarted (at most ``max_restarts`` times, after which every further call fails at once).
"""

import builtins
import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _report(fd, **fields):
    os.write(fd, (json.dumps(fields) + "\n").encode())


# --------------------------------------------------------------------------- file system


def _pivot_root_number():
    import platform

    machine = platform.machine()
    if machine == "x86_64":
        return 155
    if machine in ("aarch64", "arm64", "riscv64"):
        return 41
    raise OSError(0, f"pivot_root: unknown system call number on {machine}")


_READ_ONLY_DIRS = ("/usr", "/etc")
_TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")


def _bind_read_only(source, target):
    os.makedirs(target, mode=0o755, exist_ok=True)
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _build_root(new_root, tmp_bytes, layers):
    """A fresh root: read-only system directories, a minimal /dev, a private writable /tmp."""
    # a mount namespace of the init's own, so that the runner keeps the host's view
    _check(_libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    os.makedirs(new_root, mode=0o755, exist_ok=True)
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for path in _TOP_LINKS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), new_root + path)
        elif os.path.isdir(path):
            _bind_read_only(path, new_root + path)
    for path in _READ_ONLY_DIRS:
        if os.path.isdir(path):
            _bind_read_only(path, new_root + path)
    prefix = os.path.realpath(sys.base_prefix)
    if not any(prefix == d or prefix.startswith(d + "/") for d in _READ_ONLY_DIRS):
        _bind_read_only(prefix, new_root + prefix)
        # the directories leading to it exist on the tmpfs, mode 0755: nothing else is in them
    dev = new_root + "/dev"
    os.makedirs(dev)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in _DEVICES:
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "w").close()
            _mount("/dev/" + name, f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(new_root + "/tmp")
    _mount("tmpfs", new_root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(tmp_bytes)},mode=1777")
    os.makedirs(new_root + "/proc")
    put_old = new_root + "/.old-root"
    os.makedirs(put_old)
    _check(_libc.syscall(_pivot_root_number(), new_root.encode(), put_old.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old-root", MNT_DETACH), "umount the old root")
    os.rmdir("/.old-root")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    layers += ["own-root", "readonly-system", "private-tmp", "private-proc"]


# --------------------------------------------------------------------------- system calls

_AUDIT_ARCH_X86_64 = 0xC000003E
_SECCOMP_ALLOW, _SECCOMP_KILL, _SECCOMP_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NAMESPACE_FLAGS = 0x10000000 | 0x7E020080  # CLONE_NEWUSER and every other CLONE_NEW* flag
# x86_64 numbers: ptrace, bpf, keyctl, add_key, request_key, perf_event_open, userfaultfd, setns,
# mount, umount2, pivot_root, io_uring_{setup,enter,register}, kexec_load, kexec_file_load,
# init_module, finit_module, reboot, acct, swapon, swapoff, open_by_handle_at, fsopen, fsmount,
# move_mount, open_tree, mount_setattr
_DENIED = (101, 321, 250, 248, 249, 298, 323, 308, 165, 166, 155, 425, 426, 427, 246, 320, 175,
           313, 169, 163, 167, 168, 304, 430, 432, 429, 428, 442)
_UNSHARE, _CLONE, _CLONE3 = 272, 56, 435


def seccomp_supported():
    import platform

    return platform.machine() == "x86_64"


def _seccomp_program():
    """A classic-BPF filter: refuse namespace creation and the kernel's riskier interfaces."""
    ld = lambda offset: (0x20, 0, 0, offset)  # noqa: E731  BPF_LD | BPF_W | BPF_ABS
    ret = lambda value: (0x06, 0, 0, value)  # noqa: E731  BPF_RET | BPF_K
    eq = lambda k, jt, jf: (0x15, jt, jf, k)  # noqa: E731  BPF_JMP | BPF_JEQ | BPF_K
    prog = [ld(4), eq(_AUDIT_ARCH_X86_64, 1, 0), ret(_SECCOMP_KILL),  # another ABI (int 0x80)
            ld(0), (0x35, 0, 1, 0x40000000), ret(_SECCOMP_KILL),  # JGE: the x32 ABI
            eq(_CLONE3, 0, 1), ret(_SECCOMP_ERRNO | 38)]  # ENOSYS: libc falls back to clone
    for number in _DENIED:
        prog += [eq(number, 0, 1), ret(_SECCOMP_ERRNO | 1)]  # EPERM
    prog += [eq(_UNSHARE, 1, 0), eq(_CLONE, 0, 3),
             ld(16), (0x45, 0, 1, _NAMESPACE_FLAGS), ret(_SECCOMP_ERRNO | 1),  # JSET on flags
             ret(_SECCOMP_ALLOW)]
    return prog


def _install_seccomp():
    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    prog = _seccomp_program()
    filters = (Filter * len(prog))(*[Filter(*ins) for ins in prog])
    fprog = Program(len(prog), filters)
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


# --------------------------------------------------------------------------- the program


def _program_limits(req):
    return [
        (resource.RLIMIT_CPU, int(req["cpu_seconds"])),
        (resource.RLIMIT_AS, int(req["memory_bytes"])),
        (resource.RLIMIT_FSIZE, int(req["file_bytes"])),
        (resource.RLIMIT_NPROC, int(req["nproc"])),
        (resource.RLIMIT_NOFILE, int(req["open_files"])),
        (resource.RLIMIT_CORE, 0),
    ]


class Program:
    """One running program process with its two protocol pipes."""

    def __init__(self, ctx):
        self.ctx = ctx
        requests_r, self.requests = os.pipe()
        self.replies, replies_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the program: never returns
            try:
                self._become_program(requests_r, replies_w)
            finally:
                os._exit(127)
        os.close(requests_r)
        os.close(replies_w)
        self.pid = pid
        self.status = None

    def _become_program(self, requests_r, replies_w):
        ctx = self.ctx
        # out of the way first, so that moving one onto 3 or 4 cannot clobber the other
        high_r = fcntl.fcntl(requests_r, fcntl.F_DUPFD, 100)
        high_w = fcntl.fcntl(replies_w, fcntl.F_DUPFD, 100)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(5, 1 << 16)  # nothing else of the trusted side: results, pipes, files
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)
        os.chdir(ctx["workdir"])
        if ctx["drop_to"] is not None:
            os.setgroups([])
            os.setgid(ctx["drop_to"])
            os.setuid(ctx["drop_to"])
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        for which, value in _program_limits(ctx["req"]):
            resource.setrlimit(which, (value, value))
        if ctx["seccomp"]:
            _install_seccomp()
        env = {"PATH": "/usr/bin:/bin", "HOME": ctx["workdir"], "LANG": "C.UTF-8"}
        os.execve(ctx["python"], [ctx["python"], "-I", "-S", "-c", ctx["program_source"]], env)

    def send(self, message):
        self.ctx["codec"]["write_frame"](self.requests, message)

    def receive(self, deadline):
        """The next reply's text, or None after the deadline, at end of file or on a bad frame."""
        buffer = b""
        need = 4
        size = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.replies], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.replies, 1 << 16)
            if not chunk:
                return None
            buffer += chunk
            if size is None and len(buffer) >= 4:
                size = int.from_bytes(buffer[:4], "big")
                if size > self.ctx["codec"]["MAX_FRAME"]:
                    return None
                need = 4 + size
            if size is not None and len(buffer) >= need:
                return buffer[4:need].decode("utf-8", errors="replace")

    def kill(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait()
        for fd in (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass

    def wait(self):
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)
        return self.status


# --------------------------------------------------------------------------- test driver


class _Candidate:
    """Stands for the completion's function in the hidden tests: calls cross the protocol."""

    def __init__(self, ctx, code, entry, call_timeout, max_restarts):
        self.ctx, self.code, self.entry = ctx, code, entry
        self.call_timeout, self.max_restarts = call_timeout, max_restarts
        self.program = None
        self.calls = self.failed_loads = self.restarts = 0
        self.dead = False

    def _start(self):
        self.program = Program(self.ctx)
        try:
            self.program.send({"mode": "serve", "code": self.code, "entry": self.entry,
                               "block_sockets": self.ctx["block_sockets"]})
            text = self.program.receive(self.ctx["deadline"])
        except OSError:  # it died before reading its request
            text = None
        loaded = False
        if text is not None:
            try:
                loaded = self.ctx["codec"]["decode"](text).get("loaded") is True
            except Exception:
                loaded = False
        if not loaded:
            self.failed_loads += 1
            self._stop()
            self.dead = True  # a completion that does not load will not load next time either

    def _stop(self):
        if self.program is not None:
            self.program.kill()
            self.program = None

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError("the sandboxed candidate takes positional arguments only")
        self.calls += 1
        if self.program is None and not self.dead:
            self._start()
        if self.dead:
            raise RuntimeError("the completion is not available")
        codec = self.ctx["codec"]
        message = {"args": codec["encode"](list(args))}
        deadline = min(self.ctx["deadline"], time.monotonic() + self.call_timeout)
        try:
            self.program.send(message)
            text = self.program.receive(deadline)
        except OSError:
            text = None
        if text is None:  # hung, died or broke the protocol: restart it for the next call
            self._stop()
            if self.restarts >= self.max_restarts:
                self.dead = True
            self.restarts += 1
            raise TimeoutError("the completion did not answer")
        reply = codec["decode"](text)
        if "ok" in reply:
            return codec["restore"](reply["ok"])
        name = str(reply.get("error"))
        error = getattr(builtins, name, None)
        if isinstance(error, type) and issubclass(error, Exception):
            raise error("raised by the completion")
        raise RuntimeError(f"the completion raised {name}")


def _drive_tests(ctx, tests):
    counts = {"executed": 0, "passed": 0}

    def record(ok):
        counts["executed"] += 1
        counts["passed"] += ok is True

    candidate = _Candidate(ctx, tests["code"], tests["entry"], float(tests["call_timeout"]),
                           int(tests["max_restarts"]))
    candidate._start()
    namespace = {"__name__": "__bk_tests__", "__bk_record": record}
    finished = True
    try:
        exec(compile(tests["prelude"], "<prelude>", "exec"), namespace)  # trusted task text
        namespace[tests["entry"]] = candidate  # a test may call the function by its own name
        exec(compile(tests["test"], "<hidden tests>", "exec"), namespace)  # trusted task text
        namespace[tests["check"]](candidate)
    except BaseException:
        finished = False
    loaded = candidate.failed_loads == 0
    candidate._stop()
    return dict(counts, finished=finished, loaded=loaded, calls=candidate.calls,
                restarts=candidate.restarts)


# --------------------------------------------------------------------------- init and runner


def _init(req, ctx, namespaces, result_fd, layers):
    """PID 1 of the namespace (or the runner itself without namespaces)."""
    if namespaces:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            _build_root(os.path.abspath("root"), req["tmp_bytes"], layers)
            _libc.sethostname(b"sandbox", 7)
            ctx["workdir"] = "/tmp/work"
        except OSError as e:
            _report(result_fd, layers=layers, error=f"file system isolation failed: {e}")
            os._exit(125)
    else:
        ctx["workdir"] = os.path.abspath("work")
    os.makedirs(ctx["workdir"], exist_ok=True)
    if ctx["drop_to"] is not None:
        os.chown(ctx["workdir"], ctx["drop_to"], ctx["drop_to"])
        layers.append("uid-nobody")
    layers += ["no-new-privs", "rlimits"]
    if ctx["seccomp"]:
        layers.append("seccomp")
    if ctx["block_sockets"]:
        layers.append("socket-audit-hook")
    _report(result_fd, layers=layers)
    if req.get("tests"):
        ctx["deadline"] = time.monotonic() + float(req["timeout"])
        outcome = _drive_tests(ctx, req["tests"])
        _report(result_fd, tests=outcome)
        os._exit(0)
    program = Program(ctx)
    program.send({"mode": "run", "code": req["code"], "block_sockets": ctx["block_sockets"]})
    os.close(program.requests)
    if namespaces:  # reap orphans until the program itself ends
        while True:
            pid, status = os.wait()
            if pid == program.pid:
                break
    else:
        _, status = os.waitpid(program.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _report(result_fd, exit=code)
    os._exit(code & 0xFF if code >= 0 else 128 - code)


def main():
    req = json.loads(sys.stdin.read())
    result_fd = int(req["result_fd"])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    with open(req["program_path"]) as f:
        program_source = f.read()
    codec = {"__name__": "_sandbox_program"}
    exec(compile(program_source, req["program_path"], "exec"), codec)  # trusted, our own file
    isolate = bool(req["isolate"]) and os.geteuid() == 0
    layers = []
    namespaces = False
    if isolate:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        if _libc.unshare(flags) == 0:
            namespaces = True
            layers += ["mountns", "pidns", "netns", "ipcns", "utsns"]
    ctx = {
        "req": req, "codec": codec, "program_source": program_source,
        "python": os.path.realpath(sys.executable),
        "drop_to": _nobody() if namespaces else None,
        "block_sockets": not namespaces, "deadline": time.monotonic() + float(req["timeout"]),
        "seccomp": namespaces and seccomp_supported(),
    }
    if not namespaces:
        _init(req, ctx, False, result_fd, layers)
    init = os.fork()
    if init == 0:
        _init(req, ctx, True, result_fd, layers)
    try:  # lets the caller (and the tests) check that nothing of this namespace outlives the run
        _report(result_fd, pidns=os.readlink(f"/proc/{init}/ns/pid"))
    except OSError:
        pass
    os.close(result_fd)

    def kill_namespace(*_):
        os.kill(init, signal.SIGKILL)  # the kernel then kills every process of the namespace

    signal.signal(signal.SIGTERM, kill_namespace)
    _, status = os.waitpid(init, 0)  # returns once the namespace is empty
    code = os.waitstatus_to_exitcode(status)
    os._exit(code & 0xFF if code >= 0 else 128 - code)


def _nobody():
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return NOBODY


if __name__ == "__main__":
    main()
