"""Weight tables for objectives that mix k, and the per-batch table bank the backends read (spec 12).

A weighting ``w = (w_1, ..., w_T)`` over k means the objective ``J_w = sum_k w_k max@k``. Every
estimator that is linear in its weight tables (registry field ``linear_in_tables``: maxk, passk,
maxk_loo, maxk_loo_centered, maxk_loo1, maxk_offpolicy; and maxk_offpolicy_exact) then has the unbiased gradient weights ``sum_k w_k A^(k)``, which is the
single-k closed form with the tables d, o, q (spec 0.1) replaced by their w-weighted sums. So a
mixture costs one table build per (estimator, n, w, small_groups) in float64, cached here, and no
extra work per sample.

Bank layout (one block per group size n present in the batch; ``bank_index[n]`` = start b of the
block, -1 when there is none), ranks j = 1..n at 0-based position j-1:

    bank[b + 0n + j-1] = D_j   bank[b + 1n + j-1] = O_j   bank[b + 2n + j-1] = Q_j
    bank[b + 3n + j-1] = B_j   bank[b + 4n + j-1] = Bp_j  bank[b + 5n]       = W1

D, O, Q are the mixed d, o, q. B and Bp are the leave-one-out baseline tables (maxk_loo,
maxk_loo_centered: B_j = sum_k w_k c_k d^(n-1,k)_j, Bp_j = B_{j-1}; maxk_loo1: B_t =
sum_{k>=2} w_k (k/n) d^(n-1,k-1)_t) and W1 is the weight of maxk_loo1's k = 1 (RLOO) term.

The too-small rule is folded in here, so a backend in bank mode never looks at k: with "clamp"
the weight of every k above the group's limit moves to the limit; with "zero" (and with "error",
which was checked before, for sizes that are not checked because they are only possibly present)
a group whose largest weighted k exceeds the limit gets an all-zero block, so all its outputs are 0.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional, Sequence, Tuple

import torch

from . import estimators
from .reference import weight_tables

# All three lists are derived from the registry (fields ``linear_in_tables`` and ``backends``).
# Every estimator whose weights are linear in its tables d, o, q: a mixture over k is exact for it.
MIXABLE_ESTIMATORS = tuple(e.name for e in estimators.REGISTRY.values() if e.linear_in_tables)
# Of those, the ones a kernel implements: the kernels (and the reference, for the same call) read
# a bank of mixed tables, so a mixture costs what one k costs.
BANK_ESTIMATORS = tuple(name for name in MIXABLE_ESTIMATORS
                        if set(estimators.get(name).backends) != {"torch"})
# The reference-only ones (maxk_offpolicy_exact): a mixture is the weighted sum of single-k calls.
SUM_OVER_K_ESTIMATORS = tuple(name for name in MIXABLE_ESTIMATORS if name not in BANK_ESTIMATORS)

# The kernels read one k's tables from a bank too (single_k_bank): the tables are built once per
# call shape and cached, instead of per group in the kernel (a division per sample and more).
SINGLE_K_BANK_BACKENDS = ("cpu", "cuda", "triton")

# With a known max_group_size up to this bound, the bank holds every size 1..max_group_size, so
# building it needs no look at the (possibly GPU-resident) group sizes.
ALL_SIZES_BOUND = 64
ROWS = 5                       # D, O, Q, B, Bp; then the scalar W1
_K_CHUNK = 256                 # k values per table build, to bound memory at large n and T
_CACHE_SIZE = 512

_SMALL_GROUP_NAMES = {0: "error", 1: "zero", 2: "clamp"}


# ----------------------------------------------------------------------------- weights

def normalize_k_weights(k_weights) -> Tuple[float, ...]:
    """Validate a weighting over k = 1..T and return it as a tuple of floats, trailing zeros cut.

    Accepts a 1-D sequence or tensor of finite numbers >= 0, not all zero. A tensor on a GPU costs
    a host sync; a tuple of Python numbers (as ``maxrl_weights`` returns) is checked once and then
    found in a small cache, so a training loop's repeated calls skip the per-element checks.
    """
    plain = type(k_weights) is tuple and all(type(v) in (int, float) for v in k_weights)
    if plain and k_weights in _NORMALIZED:
        return _NORMALIZED[k_weights]
    result = _normalize(k_weights)
    if plain and len(_NORMALIZED) < _CACHE_SIZE:
        _NORMALIZED[k_weights] = result
    return result


_NORMALIZED = {}


def _normalize(k_weights) -> Tuple[float, ...]:
    if isinstance(k_weights, torch.Tensor):
        if k_weights.dim() != 1:
            raise ValueError(f"k_weights must be 1-D (weights for k = 1..T), got shape {tuple(k_weights.shape)}")
        if k_weights.dtype == torch.bool or k_weights.is_complex():
            raise TypeError(f"k_weights must hold real numbers, got dtype {k_weights.dtype}")
        values = [float(v) for v in k_weights.detach().to("cpu", torch.float64).tolist()]
    elif isinstance(k_weights, (str, bytes)) or not isinstance(k_weights, Sequence):
        raise TypeError("k_weights must be a 1-D sequence or tensor of non-negative numbers "
                        f"(weights for k = 1..T), got {type(k_weights).__name__}")
    else:
        values = []
        for i, v in enumerate(k_weights):
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not (
                    isinstance(v, torch.Tensor) and v.numel() == 1):
                raise TypeError(f"k_weights[{i}] (the weight of k = {i + 1}) must be a number, got {v!r}")
            values.append(float(v))
    for i, v in enumerate(values):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"k_weights must be finite and >= 0; the weight of k = {i + 1} is {v}")
    while values and values[-1] == 0:
        values.pop()
    if not values:
        raise ValueError("k_weights must have at least one non-zero weight")
    return tuple(values)


def largest_k(weights: Tuple[float, ...]) -> int:
    """The largest k with a non-zero weight (the k the k-versus-group-size rules apply to)."""
    return len(weights)


def maxrl_weights(T: int) -> Tuple[float, ...]:
    """MaxRL's truncation of order T: w_k = 1/k for k = 1..T (spec 12)."""
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be an int >= 1, got {T!r}")
    return tuple(1.0 / k for k in range(1, T + 1))


def parse_k_weights(text: str) -> Tuple[float, ...]:
    """Weights from a command-line / environment spelling: ``harmonic:T`` (MaxRL's 1, 1/2, ..., 1/T),
    ``uniform:T`` (1 for k = 1..T), or an explicit comma-separated list ``w_1,w_2,...,w_T``."""
    text = str(text).strip()
    kind, _, arg = text.partition(":")
    if kind in ("harmonic", "uniform"):
        try:
            T = int(arg)
        except ValueError:
            raise ValueError(f"k weights {text!r}: write {kind}:T with T an int >= 1") from None
        if T < 1:
            raise ValueError(f"k weights {text!r}: T must be >= 1")
        return maxrl_weights(T) if kind == "harmonic" else tuple([1.0] * T)
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"k weights {text!r}: write harmonic:T, uniform:T or a comma-separated "
                         "list of weights for k = 1, 2, ...") from None
    return normalize_k_weights(values)


def anneal_k_weights(k_start: int, k_end: int, progress: float) -> Tuple[float, ...]:
    """PKPO's k annealing as a mixture: the weights over k at a point of a linear schedule.

    The target k(p) = k_start + p (k_end - k_start) is in general not an integer; the schedule puts
    weight 1 - f on floor(k(p)) and f on floor(k(p)) + 1 (f the fractional part), so the objective
    is the linear interpolation of max@floor and max@ceil, and at every integer point (including
    p = 0 and p = 1) it is exactly the single-k objective. ``progress`` is clipped to [0, 1].
    Returns the weights for k = 1..max(k_start, k_end).
    """
    for name, v in (("k_start", k_start), ("k_end", k_end)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not math.isfinite(progress):
        raise ValueError(f"progress must be a finite number, got {progress!r}")
    p = min(max(float(progress), 0.0), 1.0)
    target = k_start + p * (k_end - k_start)
    low = min(int(math.floor(target)), max(k_start, k_end))
    frac = target - low
    weights = [0.0] * max(k_start, k_end)
    weights[low - 1] += 1.0 - frac
    if frac > 0:
        weights[low] += frac
    return tuple(weights)


# ----------------------------------------------------------------------------- tables for one size

def _limit(est: estimators.Estimator, n: int) -> int:
    return n - est.k_margin


def folded_weights(est: estimators.Estimator, n: int, weights: Tuple[float, ...],
                   small_groups: int) -> Optional[Tuple[float, ...]]:
    """The weights a group of size n uses after the too-small rule; None when it is zeroed."""
    limit = _limit(est, n)
    if len(weights) <= limit:
        return weights
    if small_groups != 2 or limit < 1:         # zero (error was checked, or the size is not present)
        return None
    folded = list(weights[:limit])
    folded[limit - 1] += sum(weights[limit:])
    return tuple(folded)


def _mixed(n_table: int, width: int, ks: Sequence[int], coeffs: Sequence[float]):
    """sum_i coeffs[i] * (d, o, q)^(n_table, ks[i]), each of length ``width`` (float64)."""
    D = torch.zeros(width, dtype=torch.float64)
    O = torch.zeros(width, dtype=torch.float64)
    Q = torch.zeros(width, dtype=torch.float64)
    if n_table < 1:
        return D, O, Q
    for start in range(0, len(ks), _K_CHUNK):
        k_chunk = torch.tensor(ks[start:start + _K_CHUNK], dtype=torch.int64)
        c = torch.tensor(coeffs[start:start + _K_CHUNK], dtype=torch.float64)[:, None]
        d, o, q = weight_tables(torch.full_like(k_chunk, n_table), k_chunk, width)
        D += (c * d).sum(0)
        O += (c * o).sum(0)
        Q += (c * q).sum(0)
    return D, O, Q


def _block(name: str, n: int, weights: Optional[Tuple[float, ...]]) -> torch.Tensor:
    """The float64 block (ROWS * n + 1 values) of estimator ``name`` for groups of size n."""
    block = torch.zeros(ROWS * n + 1, dtype=torch.float64)
    if weights is None or n < 1:
        return block
    pairs = [(k, w) for k, w in enumerate(weights, start=1) if w != 0]
    rows = block[:ROWS * n].view(ROWS, n)
    if name == "maxk_loo1":
        main = [(k, w) for k, w in pairs if k >= 2]
        D, O, Q = _mixed(n, n, [k for k, _ in main], [w for _, w in main])
        # B_t = sum_{k>=2} w_k (k/n) d^(n-1,k-1)_t  (= O_{t+1}, by C(n-1,k-1)/C(n,k) = k/n)
        B, _, _ = _mixed(n - 1, n, [k - 1 for k, _ in main], [w * k / n for k, w in main])
        rows[3] = B
        block[ROWS * n] = weights[0] if weights else 0.0
    else:
        D, O, Q = _mixed(n, n, [k for k, _ in pairs], [w for _, w in pairs])
        if name in ("maxk_loo", "maxk_loo_centered"):
            denom = n - 1 if name == "maxk_loo" else n
            B, _, _ = _mixed(n - 1, n, [k for k, _ in pairs], [w * k / max(denom, 1) for k, w in pairs])
            rows[3] = B
            rows[4, 1:] = B[:-1]
    rows[0], rows[1], rows[2] = D, O, Q
    return block


class _LRU:
    def __init__(self, size: int):
        self.size, self.data = size, OrderedDict()

    def get(self, key, make):
        if key in self.data:
            self.data.move_to_end(key)
            return self.data[key]
        value = make()
        self.data[key] = value
        if len(self.data) > self.size:
            self.data.popitem(last=False)
        return value

    def clear(self):
        self.data.clear()


_blocks = _LRU(_CACHE_SIZE)      # (estimator, n, weights, small_groups) -> host float64 block
_banks = _LRU(_CACHE_SIZE)       # (estimator, sizes, weights, small_groups, device) -> (bank, index)
_single_k_banks = _LRU(_CACHE_SIZE)  # (estimator, k, largest size, full, small_groups, device) -> (bank, index)


def size_block(estimator: str, n: int, weights: Tuple[float, ...], small_groups: int) -> torch.Tensor:
    """The cached host float64 block of one group size (after the too-small rule)."""
    est = estimators.get(estimator)

    def make():
        return _block(est.name, n, folded_weights(est, n, weights, small_groups))
    return _blocks.get((est.name, n, weights, small_groups), make)


def clear_cache() -> None:
    _blocks.clear()
    _banks.clear()
    _single_k_banks.clear()


# ----------------------------------------------------------------------------- the bank of a batch

def bank_sizes(offsets: torch.Tensor, max_group_size: Optional[int] = None,
               full_size: Optional[int] = None) -> Tuple[int, ...]:
    """The group sizes a bank must cover: the one size of a full [G, n] layout; every size
    1..max_group_size when that bound is known and small (no sync); else the distinct sizes
    present (one host sync when the offsets live on a GPU)."""
    if full_size is not None:
        return (int(full_size),) if full_size > 0 else ()
    if max_group_size is not None and max_group_size <= ALL_SIZES_BOUND:
        return tuple(range(1, max_group_size + 1))
    sizes = offsets[1:] - offsets[:-1]
    return tuple(int(s) for s in torch.unique(sizes).tolist() if s > 0)


def build_bank(estimator: str, weights: Tuple[float, ...], sizes: Tuple[int, ...], small_groups: int,
               device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(bank, bank_index)`` for the given group sizes, on ``device`` (cached per device)."""
    est = estimators.get(estimator)
    if est.name not in BANK_ESTIMATORS:
        raise ValueError(f"estimator {est.name!r} has no mixture tables; mixtures over k run for "
                         f"{', '.join(MIXABLE_ESTIMATORS)}")
    device = torch.device(device)

    def make():
        max_n = max(sizes) if sizes else 0
        index = torch.full((max_n + 1,), -1, dtype=torch.int64)
        blocks, start = [], 0
        for n in sorted(set(sizes)):
            block = size_block(est.name, n, weights, small_groups)
            index[n] = start
            blocks.append(block)
            start += block.numel()
        bank = torch.cat(blocks) if blocks else torch.zeros(1, dtype=torch.float64)
        return bank.to(device), index.to(device)
    return _banks.get((est.name, tuple(sorted(set(sizes))), weights, small_groups, str(device)), make)


def single_k_bank(estimator: str, k: int, max_group_size: Optional[int], full_size: Optional[int],
                  small_groups: int, device: torch.device) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The bank of one k (the weighting with all its weight on k), when the group sizes are known
    without looking at the data (a full [G, n] layout, or a bound up to ALL_SIZES_BOUND) and some
    group can hold k; else None (the kernels then build the tables per group)."""
    if full_size is None and (max_group_size is None or max_group_size > ALL_SIZES_BOUND):
        return None
    largest = full_size if full_size is not None else max_group_size
    if largest is None or k > largest or k < 1:
        return None

    def make():
        weights = (0.0,) * (k - 1) + (1.0,)
        return build_bank(estimator, weights, bank_sizes(None, max_group_size, full_size), small_groups, device)
    return _single_k_banks.get((estimator, k, largest, full_size is not None, small_groups, str(device)), make)


def small_groups_name(code: int) -> str:
    return _SMALL_GROUP_NAMES[code]
