"""What gets timed: the backends of ``bk.advantages`` and the baselines, behind one interface.

A :class:`Method` turns a :class:`CellInputs` (one set of inputs shared by every method of a cell)
into a zero-argument callable that computes the advantages. Backends are detected at run time by a
tiny real call, so a missing extension or a missing GPU shows up as "unavailable" with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from bench import baselines

BACKENDS = ("torch", "cpu", "triton", "cuda")
# The estimators the sweep covers; natural scale "sum" except grpo ("mean", as verl computes it).
ESTIMATOR_SCALE = {"maxk": "sum", "maxk_loo1": "sum", "maxk_offpolicy": "sum", "grpo": "mean"}
CLAMP_DELTA = 0.2  # Listing 3 clamps the deltas; the same clamp is passed to bk.advantages


@dataclass
class CellInputs:
    """The inputs of one benchmark cell, built once and shared by every method."""

    rewards: torch.Tensor            # [G, n] float32
    deltas: torch.Tensor | None      # [G, n] for the off-policy estimator
    k: int
    estimator: str
    flat: torch.Tensor = field(init=False)
    offsets: torch.Tensor = field(init=False)
    _group_ids: object = field(init=False, default=None)

    def __post_init__(self):
        G, n = self.rewards.shape
        self.flat = self.rewards.reshape(-1)
        self.offsets = torch.arange(G + 1, dtype=torch.int64, device=self.rewards.device) * n

    @property
    def group_ids(self):
        """Per-sample group ids for the dict-loop baseline: a numpy array, as verl passes them."""
        if self._group_ids is None:
            import numpy as np
            self._group_ids = np.repeat(np.arange(self.G), self.n)
        return self._group_ids

    @property
    def G(self) -> int:
        return self.rewards.shape[0]

    @property
    def n(self) -> int:
        return self.rewards.shape[1]

    def bytes_moved(self) -> int:
        """The least traffic any implementation needs: read rewards (and deltas), write the output."""
        item = self.rewards.element_size()
        arrays = 3 if self.deltas is not None else 2
        return arrays * self.rewards.numel() * item


def make_inputs(G: int, n: int, k: int, estimator: str, device: torch.device, seed: int = 0) -> CellInputs:
    gen = torch.Generator(device=device).manual_seed(seed)  # on the device: big GPU cells stay fast
    rewards = torch.rand(G, n, generator=gen, device=device)
    deltas = None
    if estimator == "maxk_offpolicy":
        deltas = (torch.rand(G, n, generator=gen, device=device) - 0.5) * 0.2  # |delta| <= 0.1
    return CellInputs(rewards, deltas, k, estimator)


@dataclass
class Method:
    name: str
    kind: str                      # "backend" or "baseline"
    estimators: tuple[str, ...]
    cost_exponent: float           # time ~ G * n**cost_exponent, to predict (and skip) huge cells
    build: Callable[[CellInputs], Callable[[], torch.Tensor]]
    description: str
    available: bool = True
    why_unavailable: str = ""


def _backend_call(backend: str):
    import bonkernels as bk

    def build(c: CellInputs):
        kwargs = dict(scale=ESTIMATOR_SCALE[c.estimator], backend=backend,
                      check_inputs=False, max_group_size=c.n)
        if c.deltas is not None:
            kwargs.update(deltas=c.deltas, clamp_delta=CLAMP_DELTA)
        return lambda: bk.advantages(c.rewards, c.k, c.estimator, **kwargs)

    return build


def _pkpo_listing(cached: bool):
    def build(c: CellInputs):
        return lambda: baselines.pkpo_listing(c.flat, c.offsets, c.k, c.estimator, cached=cached)
    return build


def _maxk_matrix(c: CellInputs):
    if c.estimator == "maxk_offpolicy":
        return lambda: baselines.maxk_matrix_offpolicy(c.rewards, c.deltas, c.k, CLAMP_DELTA)
    return lambda: baselines.maxk_matrix_onpolicy(c.rewards, c.k)


def _verl_loop(c: CellInputs):
    if c.estimator == "grpo":
        return lambda: baselines.verl_grpo(c.flat, c.group_ids)
    return lambda: baselines.verl_pkpo(c.flat, c.group_ids, c.k, c.estimator)


def _verl_library(c: CellInputs):
    """verl's own compute_grpo_outcome_advantage, imported (one token per response)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = c.flat[:, None]
    mask = torch.ones_like(scores)
    return lambda: compute_grpo_outcome_advantage(scores, mask, c.group_ids)[0].reshape(-1)


def _verl_importable() -> str:
    try:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: F401
    except Exception as e:  # absent, or a dependency of verl is
        return f"verl is not importable here ({type(e).__name__})"
    return ""


BASELINE_DESCRIPTIONS = {
    "pkpo_listing": "PKPO Listing 1 ported to PyTorch, a Python loop over groups; weight tables "
                    "rebuilt per group from O(k) ratio products (O(nk + n log n) per group)",
    "pkpo_listing_cached": "the same loop with the weight tables memoised per (n, k)",
    "maxk_matrix": "Bagirov et al.'s n x n weight matrix (Listings 2/3) with lgamma binomials; "
                   "on-policy: one shared matrix, one [G,n]x[n,n] product; off-policy: a matrix "
                   "per group, batched in chunks (O(n^2) per group)",
    "verl_loop": "verl's compute_grpo_outcome_advantage copied: a per-sample Python loop over a dict "
                 "of group ids (grpo); for PKPO the same grouping with Listing 1 per group",
    "verl": "verl's compute_grpo_outcome_advantage imported from the installed verl (grpo only; "
            "scores as [N, 1] token rewards)",
}


def baseline_methods() -> list[Method]:
    d = BASELINE_DESCRIPTIONS
    return [
        Method("pkpo_listing", "baseline", ("maxk", "maxk_loo1"), 1.0, _pkpo_listing(False), d["pkpo_listing"]),
        Method("pkpo_listing_cached", "baseline", ("maxk", "maxk_loo1"), 1.0, _pkpo_listing(True),
               d["pkpo_listing_cached"]),
        Method("maxk_matrix", "baseline", ("maxk", "maxk_offpolicy"), 2.0, _maxk_matrix, d["maxk_matrix"]),
        Method("verl_loop", "baseline", ("grpo", "maxk_loo1"), 1.0, _verl_loop, d["verl_loop"]),
        Method("verl", "baseline", ("grpo",), 1.0, _verl_library, d["verl"],
               available=not _verl_importable(), why_unavailable=_verl_importable()),
    ]


def _probe_backend(backend: str, device: torch.device) -> str:
    """'' if ``bk.advantages(..., backend=backend)`` works on ``device``, else the reason it does not."""
    try:
        import bonkernels as bk
    except Exception as e:  # the package itself is broken or absent
        return f"import bonkernels failed: {type(e).__name__}: {e}"
    if not hasattr(bk, "advantages"):
        return "bonkernels.advantages is not defined yet"
    if backend == "triton" and device.type != "cuda":
        return "Triton kernels are timed on a GPU only (interpreter timings are not kernel timings)"
    if backend == "cpu" and device.type != "cpu":
        return "the cpu backend runs on CPU tensors; this run uses a GPU"
    if backend == "cuda" and device.type != "cuda":
        return "no GPU in this run"
    try:
        r = torch.rand(3, 4, device=device)
        bk.advantages(r, 2, "maxk_loo1", scale="sum", backend=backend)
        bk.advantages(r, 2, "maxk_offpolicy", deltas=torch.zeros_like(r), scale="sum", backend=backend)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {msg}"[:200]
    return ""


def backend_methods(device: torch.device) -> list[Method]:
    out = []
    for b in BACKENDS:
        why = _probe_backend(b, device)
        build = _backend_call(b) if not why else None
        desc = {"torch": "bk.advantages, pure-PyTorch reference backend",
                "cpu": "bk.advantages, native C++ CPU kernel",
                "triton": "bk.advantages, Triton kernels",
                "cuda": "bk.advantages, native CUDA kernels"}[b]
        out.append(Method(b, "backend", tuple(ESTIMATOR_SCALE), 1.0, build, desc,
                          available=not why, why_unavailable=why))
    return out
