"""Atomic checkpoints and RNG state capture, so a killed run resumes exactly where it stopped.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced, then
renamed over the old one (and the directory fsynced): a crash at any moment leaves either the old
or the new checkpoint, never a torn one. A crash during the write leaves the temporary file
(".checkpoint.pt.XXXX"); ``remove_stale_temp_files`` deletes such files when a run starts.
"""

from __future__ import annotations

import io
import json
import os
import random
import tempfile

import numpy as np
import torch

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(RuntimeError):
    pass


def _temp_prefix(path: str) -> str:
    return "." + os.path.basename(path) + "."


def atomic_write_bytes(path: str, data: bytes, *, halfway=None) -> None:
    """Write data to path atomically; ``halfway()`` (fault injection) runs with half written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if halfway is not None:
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                halfway()
                data = data[len(data) // 2:]
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_save(obj, path: str, *, halfway=None) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue(), halfway=halfway)


def remove_stale_temp_files(directory: str, names) -> list[str]:
    """Delete the temporary files a killed atomic write of any of names left in directory."""
    removed = []
    if not os.path.isdir(directory):
        return removed
    prefixes = tuple(_temp_prefix(name) for name in names)
    for entry in sorted(os.listdir(directory)):
        if entry.startswith(prefixes):
            os.unlink(os.path.join(directory, entry))
            removed.append(entry)
    return removed


def atomic_write_json(obj, path: str) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load(path: str):
    return torch.load(path, map_location="cpu", weights_only=False)


def load_checkpoint(path: str) -> dict:
    """A training checkpoint; a damaged one raises CheckpointError naming the file and the fix."""
    try:
        if os.path.getsize(path) == 0:
            raise ValueError("the file is empty")
        state = load(path)
        if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= set(state):
            raise ValueError("it is not a training checkpoint")
    except Exception as e:
        raise CheckpointError(
            f"{path} cannot be resumed from: it is damaged or incomplete ({type(e).__name__}: "
            f"{e}). Checkpoints are written atomically, so this file was truncated or changed "
            f"after it was written (a full disk, a partial copy). Restore a good copy of it, or "
            f"delete it and run --resume again to restart this run from its beginning with its "
            f"saved configuration.") from e
    return state
