"""Group layouts: turn any of the three user layouts into the packed form once, and back.

Every backend works on the packed form: ``values [N]`` with groups stored contiguously and CSR
``offsets [G+1]``. A :class:`GroupLayout` remembers how to get there from the user's tensor and how
to put a packed result back into the user's shape.

Layouts:
* full 2-D ``[G, n]`` (no layout argument): every row is a group;
* padded ``[G, n]`` + ``lengths [G]``: the first ``lengths[g]`` entries of row g are valid;
* packed ``[N]`` + ``offsets [G+1]``;
* ``[N]`` + ``group_ids [N]``: any integer ids, in any order; group g is the g-th smallest id.

Building the packed form needs no host sync for the full, padded (with ``flat_padding=True``) and
packed layouts. ``group_ids`` always syncs: the number of groups is the number of distinct ids, a
data-dependent size (pass ``offsets`` for a sync-free call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _require_integer(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INTEGER_DTYPES:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def _require_same_device(name: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but rewards are on {ref.device}")


@dataclass
class GroupLayout:
    """How a user tensor maps to the packed (values, offsets) form."""

    kind: str                         # "full", "padded", "padded_flat", "packed" or "ids"
    shape: torch.Size                 # the user tensor's shape
    offsets: torch.Tensor             # int64 [G+1]
    mask: Optional[torch.Tensor] = None       # padded: [G, n] bool, True where valid
    perm: Optional[torch.Tensor] = None       # ids: packed position -> user position
    unique_ids: Optional[torch.Tensor] = None  # ids: the id of each group, ascending

    @property
    def num_groups(self) -> int:
        return self.offsets.numel() - 1

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like the rewards, as a contiguous packed [N] tensor."""
        if self.kind == "full":
            return t.reshape(-1)
        if self.kind == "padded":
            return t[self.mask]
        if self.kind == "packed":
            return t.contiguous()
        if self.kind == "padded_flat":
            return t.reshape(-1)
        return t[self.perm]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """A packed [N] result in the user's layout (padded tail positions are 0)."""
        if self.kind == "full":
            return packed.reshape(self.shape)
        if self.kind == "padded":
            out = packed.new_zeros(self.shape)
            out[self.mask] = packed
            return out
        if self.kind == "packed":
            return packed
        if self.kind == "padded_flat":
            return torch.where(self.mask, packed.reshape(self.shape), packed.new_zeros(()))
        out = torch.empty_like(packed)
        out[self.perm] = packed
        return out

    def describe(self, g: int) -> str:
        """How to name group g in an error message."""
        if self.kind == "ids":
            return f"group {g} (group id {int(self.unique_ids[g])})"
        if self.kind in ("full", "padded"):
            return f"group {g} (row {g})"
        if self.kind == "padded_flat":
            return f"group {g} (row {g // 2}{', its padding' if g % 2 else ''})"
        return f"group {g}"

    def group_of(self, packed_index: int) -> int:
        """The group that holds a packed position."""
        return int(torch.searchsorted(self.offsets, torch.tensor(packed_index, device=self.offsets.device),
                                      right=True)) - 1


def make_layout(rewards: torch.Tensor, *, offsets=None, lengths=None, group_ids=None,
                check: bool = True, flat_padding: bool = False) -> GroupLayout:
    """Validate the layout arguments against ``rewards`` and build the :class:`GroupLayout`.

    Shape, dtype and device checks always run (they are free); checks of the values of
    offsets/lengths need the host and run only when ``check`` is true.

    ``flat_padding`` (padded layout only): pack without a host sync. Row g's padding tail becomes a
    group of its own (group 2g + 1 after the valid prefix, group 2g), so the packed values are the
    whole ``[G * n]`` tensor; ``unpack`` writes 0 to the tails. Only for ops whose per-group results
    are independent (advantages): the padding groups' values are computed and thrown away.
    """
    given = [name for name, v in (("offsets", offsets), ("lengths", lengths), ("group_ids", group_ids))
             if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of offsets, lengths, group_ids (got {', '.join(given)})")
    device = rewards.device

    if offsets is not None:
        _require_integer("offsets", offsets)
        _require_same_device("offsets", offsets, rewards)
        if rewards.dim() != 1:
            raise ValueError(f"with offsets, rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
        if offsets.dim() != 1 or offsets.numel() < 1:
            raise ValueError(f"offsets must be 1-D [G+1] with at least one entry, got shape {tuple(offsets.shape)}")
        offsets = offsets.to(torch.int64)
        if check:
            _check_offsets(offsets, rewards.numel())
        return GroupLayout("packed", rewards.shape, offsets)

    if lengths is not None:
        _require_integer("lengths", lengths)
        _require_same_device("lengths", lengths, rewards)
        if rewards.dim() != 2:
            raise ValueError(f"with lengths, rewards must be 2-D [G, n], got shape {tuple(rewards.shape)}")
        if lengths.dim() != 1 or lengths.numel() != rewards.shape[0]:
            raise ValueError(f"lengths must be 1-D with one entry per row ({rewards.shape[0]}), "
                             f"got shape {tuple(lengths.shape)}")
        lengths = lengths.to(torch.int64)
        mask = torch.arange(rewards.shape[1], device=device)[None, :] < lengths[:, None]
        if check:
            bad = ((lengths < 0) | (lengths > rewards.shape[1])).nonzero()
            if bad.numel():
                g = int(bad[0])
                raise ValueError(f"lengths[{g}] = {int(lengths[g])} is outside [0, {rewards.shape[1]}] "
                                 f"(group {g})")
        if flat_padding:
            G, n = rewards.shape
            starts = torch.arange(G, dtype=torch.int64, device=device) * n
            offsets = torch.full((2 * G + 1,), G * n, dtype=torch.int64, device=device)
            offsets[0:2 * G:2] = starts
            offsets[1:2 * G:2] = starts + lengths.clamp(0, n)
            return GroupLayout("padded_flat", rewards.shape, offsets, mask=mask)
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return GroupLayout("padded", rewards.shape, offsets, mask=mask)

    if group_ids is not None:
        _require_integer("group_ids", group_ids)
        _require_same_device("group_ids", group_ids, rewards)
        if rewards.dim() != 1:
            raise ValueError(f"with group_ids, rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
        if group_ids.shape != rewards.shape:
            raise ValueError(f"group_ids must have the shape of rewards {tuple(rewards.shape)}, "
                             f"got {tuple(group_ids.shape)}")
        perm = torch.argsort(group_ids, stable=True)
        unique_ids, counts = torch.unique_consecutive(group_ids[perm], return_counts=True)
        offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=offsets[1:])
        return GroupLayout("ids", rewards.shape, offsets, perm=perm, unique_ids=unique_ids)

    if rewards.dim() != 2:
        raise ValueError("rewards must be 2-D [G, n] unless offsets, lengths or group_ids say how it is "
                         f"grouped; got shape {tuple(rewards.shape)}")
    G, n = rewards.shape
    return GroupLayout("full", rewards.shape, full_offsets(G, n, device))


_FULL_OFFSETS: dict = {}
_FULL_OFFSETS_KEEP = 32


def full_offsets(G: int, n: int, device: torch.device) -> torch.Tensor:
    """Offsets 0, n, ..., G n of a ``[G, n]`` batch, kept per (G, n, device, stream) for the next
    call of that shape (a training loop repeats it): on a GPU that saves two launches and an
    allocation per call. Nothing writes offsets. Kept per CUDA stream because the kernel that fills
    them runs on the stream of the first call: another stream could read them before it ran. Built
    afresh, and not kept, while torch.compile traces or a CUDA graph captures (a kept tensor would
    belong to the graph's memory pool)."""
    def fresh():
        if n == 0:
            return torch.zeros(G + 1, dtype=torch.int64, device=device)
        return torch.arange(0, G * n + 1, n, dtype=torch.int64, device=device)

    cuda = device.type == "cuda"
    if torch.compiler.is_compiling() or (cuda and torch._C._cuda_isCurrentStreamCapturing()):
        return fresh()
    key = (G, n, device, _current_stream_handle(device) if cuda else None)
    hit = _FULL_OFFSETS.get(key)
    if hit is not None:
        return hit
    offsets = fresh()
    if len(_FULL_OFFSETS) >= _FULL_OFFSETS_KEEP:
        _FULL_OFFSETS.pop(next(iter(_FULL_OFFSETS)))  # the oldest shape
    _FULL_OFFSETS[key] = offsets
    return offsets


def _current_stream_handle(device: torch.device) -> int:
    """torch's current stream on a CUDA device, as its raw handle. The private getter Triton's
    launcher also uses: torch.cuda.current_stream builds a Stream object, a few microseconds a
    small call feels."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)


def _check_offsets(offsets: torch.Tensor, N: int) -> None:
    if int(offsets[0]) != 0:
        raise ValueError(f"offsets must start at 0, got offsets[0] = {int(offsets[0])}")
    sizes = offsets[1:] - offsets[:-1]
    bad = (sizes < 0).nonzero()
    if bad.numel():
        g = int(bad[0])
        raise ValueError(f"offsets must be non-decreasing: offsets[{g + 1}] = {int(offsets[g + 1])} < "
                         f"offsets[{g}] = {int(offsets[g])} (group {g})")
    if int(offsets[-1]) != N:
        raise ValueError(f"offsets must end at N = {N} (the number of rewards), got offsets[-1] = "
                         f"{int(offsets[-1])}")
