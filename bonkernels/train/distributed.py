"""Data parallelism with torch.distributed (gloo on CPU, NCCL on GPU), started by torchrun.

Each rank samples and scores whole groups (the advantages of a group need all of its samples),
computes its loss, and gradients are averaged across ranks before the optimiser step, so every
rank keeps identical weights.

Shutting down cleanly takes care. A gloo worker thread releases a collective's tensors only after
the caller has seen the collective finish, and releasing a tensor that Python once wrapped needs
the GIL. If the main thread has begun to finalise the interpreter by then, the worker thread cannot
take the GIL and the process aborts ("terminate called without an active exception"), after a
run that otherwise succeeded. So every tensor handed to a collective here is one this module made
and tracks, and ``close`` waits until the backend has let go of all of them before the last
barrier.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import threading
import warnings
import weakref

import torch
import torch.distributed as dist


class _Handoffs:
    """Tensors handed to collectives that the backend may still hold, watched through finalizers."""

    def __init__(self):
        self._held: set[int] = set()
        self._keys = itertools.count()
        self._changed = threading.Condition()

    def track(self, t: torch.Tensor) -> torch.Tensor:
        """t (a new tensor about to be handed to a collective), watched until it is freed."""
        key = next(self._keys)
        with self._changed:
            self._held.add(key)
        # runs when the tensor's Python object is freed: on the thread that released it last
        weakref.finalize(t, self._release, key)
        return t

    def _release(self, key: int):
        with self._changed:
            self._held.discard(key)
            self._changed.notify_all()

    def pending(self) -> int:
        with self._changed:
            return len(self._held)

    def wait_released(self, timeout: float) -> bool:
        """Block (without the GIL) until the backend has released every tracked tensor."""
        gc.collect()  # a tensor caught in a reference cycle is freed only by the collector
        with self._changed:
            return self._changed.wait_for(lambda: not self._held, timeout)


class Dist:
    def __init__(self, device: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.enabled = self.world > 1
        self._handoffs = _Handoffs()
        if self.enabled and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list) -> list:
        """This rank's share of a list (round robin)."""
        return items[self.rank::self.world]

    def barrier(self):
        if self.enabled:
            dist.barrier()

    def all_gather_objects(self, obj) -> list:
        """Every rank's obj (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        payload = pickle.dumps(obj)
        longs = dict(dtype=torch.int64, device=self.device)
        track = self._handoffs.track
        size = track(torch.tensor([len(payload)], **longs))
        sizes = [track(torch.zeros(1, **longs)) for _ in range(self.world)]
        dist.all_gather(sizes, size)
        lengths = [int(s) for s in sizes]
        longest = max(lengths)
        bytes_ = dict(dtype=torch.uint8, device=self.device)
        padded = track(torch.zeros(longest, **bytes_))
        padded[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        gathered = [track(torch.empty(longest, **bytes_)) for _ in range(self.world)]
        dist.all_gather(gathered, padded)
        return [pickle.loads(g[:n].cpu().numpy().tobytes()) for g, n in zip(gathered, lengths)]

    def broadcast_module(self, module):
        """Copy rank 0's parameters and buffers into every rank's module."""
        if not self.enabled:
            return
        values = list(module.state_dict().values())
        for dtype in sorted({t.dtype for t in values}, key=str):  # one collective per dtype
            same = [t for t in values if t.dtype == dtype]
            flat = self._handoffs.track(torch.cat([t.detach().reshape(-1) for t in same]))
            dist.broadcast(flat, src=0)
            offset = 0
            with torch.no_grad():
                for t in same:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    def average_gradients(self, params):
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._handoffs.track(torch.cat([g.reshape(-1) for g in grads]))
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n

    def mean(self, value: float) -> float:
        if not self.enabled:
            return value
        t = self._handoffs.track(torch.tensor([value], dtype=torch.float64, device=self.device))
        dist.all_reduce(t)
        return float(t) / self.world

    def pending_handoffs(self) -> int:
        """How many tensors handed to collectives the backend (or a caller) still holds."""
        return self._handoffs.pending()

    def close(self, timeout: float = 60.0):
        """Wait for the backend to release every tensor, then the last barrier (every rank
        waits here for the others, rank 0's report included), then tear down."""
        if not (self.enabled and dist.is_initialized()):
            return
        if not self._handoffs.wait_released(timeout):
            warnings.warn(f"rank {self.rank}: {self._handoffs.pending()} tensor(s) handed to "
                          f"collectives were still held after {timeout:.0f} s; the process may "
                          f"abort while the interpreter shuts down", RuntimeWarning, stacklevel=2)
        dist.barrier()  # nothing in flight holds a Python tensor now, so neither does this one
        dist.destroy_process_group()
