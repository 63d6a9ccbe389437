"""The untrusted side of the sandbox: what runs in the program's own, fresh interpreter.

The sandbox's trusted init (``_sandbox_child.py``) starts ``python -I -S -c <this source>`` as
user nobody with a clean address space (a fresh ``execve``, so nothing of the trusted process's
memory, such as hidden tests, is inherited). The interpreter reads one request frame from fd 3:
{"mode": "run" | "serve", "code": ..., "entry": ..., "block_sockets": bool} and

* "run": executes the code as ``__main__`` and exits with its status;
* "serve": executes the code (e.g. a prompt and a model's completion), answers {"loaded": ...}
  on fd 4, then answers call frames {"args": [...]} with {"ok": value} or {"error": "TypeName"}
  until fd 3 closes. The caller (the trusted test driver) compares the values itself, so the
  program never sees the tests, the expected values or the result channel; all it controls is
  the plain data it returns.

Frames are a 4-byte big-endian length and a JSON document. Values cross as tagged JSON (see
``encode``/``restore``): None, bool, int, float (inf and nan included), str, list, and the tagged
tuple, dict, set, frozenset, bytes and complex. Nothing else crosses, so a program cannot hand the
driver an object with its own ``__eq__``. The trusted side reuses ``encode``, ``restore`` and the
frame functions of this file (it executes this source in its own namespace).

Standard library only: the interpreter runs with ``-I -S``.
"""

import json
import os
import struct
import sys

MAX_FRAME = 4 << 20  # bytes; a larger frame is a protocol error
MAX_DEPTH = 64


class ProtocolError(Exception):
    pass


def encode(value, depth=0):
    """Plain data -> JSON-able tagged form; anything else raises TypeError."""
    if depth > MAX_DEPTH:
        raise TypeError("value nested too deeply")
    # subclasses become their plain base type: nothing of a program's own class crosses
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"t": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"f": [encode(v, depth + 1) for v in value]}
    if isinstance(value, set):
        return {"s": [encode(v, depth + 1) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [float(value.real), float(value.imag)]}
    raise TypeError(f"cannot pass a {type(value).__name__} across the sandbox boundary")


def restore(value):
    """The inverse of ``encode``: tagged JSON -> plain data (only the types listed above)."""
    if isinstance(value, list):
        return [restore(v) for v in value]
    if not isinstance(value, dict):
        return value  # None, bool, int, float, str
    if len(value) != 1:
        raise ProtocolError("malformed tagged value")
    (tag, body), = value.items()
    if tag == "t":
        return tuple(restore(v) for v in body)
    if tag == "d":
        return {restore(k): restore(v) for k, v in body}
    if tag == "s":
        return {restore(v) for v in body}
    if tag == "f":
        return frozenset(restore(v) for v in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    raise ProtocolError(f"unknown tag {tag!r}")


def decode(text):
    """A frame's JSON text -> its envelope (a dict); values inside still need ``restore``."""
    message = json.loads(text)
    if not isinstance(message, dict):
        raise ProtocolError("a frame must be a JSON object")
    return message


def write_frame(fd, message):
    data = json.dumps(message).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, size):
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    """The next frame as JSON text, or None at end of file."""
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_FRAME:
        raise ProtocolError("frame too large")
    body = _read_exact(fd, size)
    return None if body is None else body.decode()


def _block_sockets():
    # Without a network namespace: refuse socket creation from Python (a program using ctypes or a
    # subprocess gets past this; the driver reports the layer as weaker and refuses by default).
    def hook(event, args):
        if event.startswith("socket.") and event != "socket.getaddrinfo":
            raise PermissionError(f"network access is disabled in the sandbox ({event})")

    sys.addaudithook(hook)


def _run(code):
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<sandboxed program>", "exec"), namespace)  # noqa: S102 (sandboxed)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # any failure of the program is its own business
        print(f"{type(e).__name__}: {e}"[:2000], file=sys.stderr)
        return 1
    return 0


def _serve(code, entry):
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<completion>", "exec"), namespace)  # noqa: S102 (sandboxed)
        function = namespace[entry]
        if not callable(function):
            raise TypeError(f"{entry} is not callable")
    except BaseException as e:
        write_frame(4, {"loaded": False, "error": type(e).__name__})
        return 1
    write_frame(4, {"loaded": True})
    while True:
        text = read_frame(3)
        if text is None:
            return 0
        try:
            args = restore(decode(text)["args"])
            reply = {"ok": encode(function(*args))}
        except BaseException as e:
            reply = {"error": type(e).__name__}
        try:
            write_frame(4, reply)
        except (TypeError, ValueError):  # e.g. an int too long to print
            write_frame(4, {"error": "ValueError"})


def main():
    request = json.loads(read_frame(3))
    if request.get("block_sockets"):
        _block_sockets()
    if request["mode"] == "serve":
        rc = _serve(request["code"], request["entry"])
    else:
        os.close(3)
        os.close(4)
        rc = _run(request["code"])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(rc & 0xFF if isinstance(rc, int) else 1)


if __name__ == "__main__":
    main()
