"""Runs inside the sandbox's child process (started by ``sandbox.py``; stdlib only, no imports
from the package, because it runs with ``python -I -S``).

It reads one JSON request from stdin: {"code", "cpu_seconds", "memory_bytes", "file_bytes",
"nproc", "open_files"}. As root it first isolates itself:

1. ``unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID)``: a network namespace with no interface
   up (no network at all, not even loopback), a private mount table, and a PID namespace whose
   first process is the program: when it ends or is killed, the kernel kills everything it
   started, including processes that escaped its process group with setsid();
2. in the forked child (PID 1 of the new namespace): fresh tmpfs over every world-writable
   directory (/tmp, /var/tmp, /dev/shm, /run/lock) and a fresh /proc (the trainer's processes
   are invisible), a fresh working directory /tmp/work;
3. drop to the unprivileged user ``nobody`` (so it cannot signal, read or write the trainer's
   files or processes, and RLIMIT_NPROC binds), then set the parent-death signal;
4. resource limits: CPU seconds, address space, file size, process count, open files, no core.

Without root (or where namespaces are refused) it keeps what it can: the resource limits, an
audit hook that refuses socket creation, and the parent's process-group kill. It reports which
layers are active on stderr as ``BK_SANDBOX_LAYERS=...``.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
PR_SET_PDEATHSIG = 1
SIGKILL = 9


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, source, target, fstype, flags, data):
    enc = (lambda s: s.encode() if s is not None else None)
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}")


def _isolate_filesystem(libc, layers):
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, None)
    for path in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    layers.append("private-tmp")
    _expose_python(libc, layers)
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV, None)
        layers.append("private-proc")
    except OSError:
        pass


def _expose_python(libc, layers):
    """Let user nobody read the standard library when it lives under a private directory.

    (pyenv puts it under /root, mode 0700.) The first ancestor that others cannot traverse is
    covered by an empty tmpfs (hiding everything else in it, e.g. /root's files), and only the
    interpreter's prefix is bound back into it, read-only.
    """
    prefix = os.path.realpath(sys.base_prefix)
    parts = prefix.strip("/").split("/")
    closed = None
    for i in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if not os.stat(path).st_mode & 0o001:
            closed = path
            break
    if closed is None:
        return
    stage = "/tmp/.bk-python"
    os.makedirs(stage)
    _mount(libc, prefix, stage, None, MS_BIND | MS_REC, None)
    _mount(libc, "tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    _mount(libc, stage, prefix, None, MS_BIND | MS_REC, None)
    _mount(libc, None, prefix, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    layers.append("masked-" + closed)


def _nobody():
    import pwd

    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def _drop_privileges(user, layers):
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    layers.append("uid-nobody")


def _set_limits(req, layers):
    limits = [
        (resource.RLIMIT_CPU, int(req["cpu_seconds"])),
        (resource.RLIMIT_AS, int(req["memory_bytes"])),
        (resource.RLIMIT_FSIZE, int(req["file_bytes"])),
        (resource.RLIMIT_NPROC, int(req["nproc"])),
        (resource.RLIMIT_NOFILE, int(req["open_files"])),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    layers.append("rlimits")


def _block_sockets(layers):
    def hook(event, args):
        if event.startswith("socket.") and event != "socket.getaddrinfo":
            raise PermissionError(f"network access is disabled in the sandbox ({event})")

    sys.addaudithook(hook)
    layers.append("socket-audit-hook")


def _run_program(code):
    # Runs untrusted code: only ever inside the isolated, unprivileged, limited child.
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<sandboxed program>", "exec"), namespace)  # noqa: S102 (sandboxed)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return code
    except BaseException as e:  # any failure of the program is its own business
        print(f"{type(e).__name__}: {e}"[:2000], file=sys.stderr)
        return 1
    return 0


def main():
    req = json.loads(sys.stdin.read())
    sys.stdin.close()
    layers = []
    libc = _libc()
    namespaces = False
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID) == 0:
            namespaces = True
            layers += ["netns", "pidns", "mountns"]
    if namespaces:
        pid = os.fork()
        if pid:  # the runner: waits for PID 1 of the namespace and passes its status on
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 137)
        try:
            _isolate_filesystem(libc, layers)
        except OSError:
            pass
        # the parent's fresh temporary directory, unless /tmp is now our own tmpfs
        workdir = "/tmp/work" if "private-tmp" in layers else os.path.abspath("work")
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
        user = _nobody()
        if user is not None:
            os.chown(workdir, user.pw_uid, user.pw_gid)
            _drop_privileges(user, layers)
        # set after the uid change, which clears it
        if libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) == 0:
            layers.append("pdeathsig")
    else:
        os.makedirs("work", exist_ok=True)  # inside the parent's fresh temporary directory
        os.chdir("work")
    _set_limits(req, layers)
    if not namespaces:
        _block_sockets(layers)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": os.getcwd(), "LANG": "C.UTF-8"})
    print("BK_SANDBOX_LAYERS=" + ",".join(layers), file=sys.stderr, flush=True)
    rc = _run_program(req["code"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    main()
