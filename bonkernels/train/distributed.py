"""Data parallelism with torch.distributed (gloo on CPU, NCCL on GPU), started by torchrun.

Each rank samples and scores whole groups (the advantages of a group need all of its samples),
computes its loss, and gradients are averaged across ranks before the optimiser step, so every
rank keeps identical weights.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


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
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_module(self, module):
        if self.enabled:
            for t in module.state_dict().values():
                dist.broadcast(t, src=0)

    def average_gradients(self, params):
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
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
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t) / self.world

    def close(self):
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()
