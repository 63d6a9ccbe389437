"""Pure-PyTorch implementation of every estimator: the specification in code, and the CPU fallback.

Plain and vectorised over groups (no Python loop over groups). Each call:
1. pads the packed groups into a [G, n_max] float64 matrix (padding is masked, never a value);
2. sorts every row ascending (ties in any order: every estimator is tie-invariant in value);
3. builds the float64 weight tables d, o, q of each group by the downward ratio recurrence
   (spec 0.1), as one reversed cumulative product;
4. evaluates the estimator's closed form with exclusive prefix/suffix scans (spec 2-6);
5. converts the scale, zeroes too-small groups, clips, and scatters back to packed order.

The formulas, their derivations and the tests that cover them are in docs/spec.md ("spec N.M" below
is its section N.M); the per-group summary is docs/conventions.md. x below is the sorted reward row,
j the 1-based rank. The native per-group math (csrc/include/bonkernels/group_math.h) and the Triton
kernel (bonkernels/triton/_advantages_kernel.py) use the same closed forms and variable names.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import estimators

# The exact off-policy estimator costs O(n^2 k) per group; above this group size it is refused.
OFFPOLICY_EXACT_MAX_N = 256


# ----------------------------------------------------------------------------- scans

def prefix_exclusive(v: torch.Tensor) -> torch.Tensor:
    """out[:, j] = sum_{t<j} v[:, t]."""
    return F.pad(torch.cumsum(v, 1)[:, :-1], (1, 0))


def suffix_exclusive(v: torch.Tensor) -> torch.Tensor:
    """out[:, j] = sum_{t>j} v[:, t]."""
    return F.pad(suffix_inclusive(v)[:, 1:], (0, 1))


def suffix_inclusive(v: torch.Tensor) -> torch.Tensor:
    """out[:, j] = sum_{t>=j} v[:, t]."""
    return torch.flip(torch.cumsum(torch.flip(v, (1,)), 1), (1,))


def shift_left(v: torch.Tensor) -> torch.Tensor:
    """out[:, j] = v[:, j+1], 0 at the end."""
    return F.pad(v[:, 1:], (0, 1))


# ----------------------------------------------------------------------------- weight tables

def weight_tables(n: torch.Tensor, k: torch.Tensor, width: int):
    """Float64 tables d, o, q ([G, width]) of max@k for groups of sizes n and targets k (spec 0.1).

    d_j = C(j-1,k-1)/C(n,k), o_j = C(j-2,k-2)/C(n,k), q_j = C(j-3,k-3)/C(n,k) for ranks j <= n,
    0 beyond. d comes from the downward recurrence d_n = k/n, d_{j-1} = d_j (j-k)/(j-1): every
    factor lies in [0, 1], so nothing overflows.
    """
    j = torch.arange(1, width + 1, dtype=torch.float64, device=n.device)[None, :]
    nn = n.to(torch.float64)[:, None]
    kk = k.to(torch.float64)[:, None]
    in_group = j <= nn
    # factor f_t = (t-k)/(t-1) links d_{t-1} to d_t; t = 1 and ranks past n contribute 1
    # (group_math.h: table_factor; Triton: _max_table's factor, stored one rank lower).
    factor = torch.where(in_group & (j >= 2), (j - kk) / (j - 1).clamp(min=1), torch.ones_like(j))
    # d_j = (k/n) * suffix_product_j, suffix_product_j = prod_{t>j} f_t: a reversed exclusive
    # cumulative product (the same name in group_math.h weights_by_scan and Triton _max_table).
    suffix_product = F.pad(torch.flip(torch.cumprod(torch.flip(factor, (1,)), 1), (1,))[:, 1:], (0, 1),
                           value=1.0)
    d = torch.where(in_group, (kk / nn.clamp(min=1)) * suffix_product, torch.zeros_like(j))
    d = d.clamp(min=0.0)  # ranks below k: exactly 0 (not -0.0 from the sign of (t-k))
    o = torch.where(j >= 2, d * (kk - 1) / (j - 1).clamp(min=1), torch.zeros_like(d))
    q = torch.where(j >= 3, o * (kk - 2) / (j - 2).clamp(min=1), torch.zeros_like(d))
    return d, o.clamp(min=0.0), q.clamp(min=0.0)


# ----------------------------------------------------------------------------- padded, sorted groups

class SortedGroups:
    """The packed groups as a sorted, padded float64 matrix, with what is needed to go back."""

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor] = None,
                 exact_width: Optional[int] = None):
        self.sizes = offsets[1:] - offsets[:-1]
        G = self.sizes.numel()
        # The widest group, found here (one host sync) rather than trusted from a caller's hint;
        # exact_width is for callers whose layout fixes every size (groups of one given size).
        width = max(exact_width if exact_width is not None else (int(self.sizes.max()) if G else 0), 1)
        self.width = width
        cols = torch.arange(width, device=values.device)
        self.valid = cols[None, :] < self.sizes[:, None]
        index = (offsets[:-1, None] + cols[None, :]).clamp(max=max(values.numel() - 1, 0))
        raw = values.to(torch.float64)[index] if values.numel() else torch.zeros(G, width, dtype=torch.float64,
                                                                                 device=values.device)
        key = torch.where(self.valid, raw, torch.full_like(raw, math.inf))
        x, self.order = torch.sort(key, dim=1)
        self.x = torch.where(self.valid, x, torch.zeros_like(x))
        self.n = self.sizes.to(torch.float64)[:, None]
        self.deltas = None
        if deltas is not None:
            raw_d = deltas.to(torch.float64)[index] if deltas.numel() else torch.zeros_like(raw)
            self.deltas = torch.where(self.valid, torch.gather(raw_d, 1, self.order), torch.zeros_like(raw))

    def scatter_back(self, sorted_values: torch.Tensor) -> torch.Tensor:
        """Sorted [G, width] values -> packed [N] in the original order."""
        unsorted = torch.zeros_like(sorted_values).scatter_(1, self.order, sorted_values)
        return unsorted[self.valid]

    def top(self) -> torch.Tensor:
        """The group maximum, [G, 1]."""
        last = (self.sizes - 1).clamp(min=0)[:, None]
        return torch.gather(self.x, 1, last)

    def masked(self, v: torch.Tensor) -> torch.Tensor:
        return torch.where(self.valid, v, torch.zeros_like(v))

    def mean(self, v: torch.Tensor) -> torch.Tensor:
        """Group mean, computed around the first element so a constant group's mean is exact
        (then v - mean is exactly 0 there, instead of rounding noise that a z-score amplifies)."""
        ref = v[:, :1]
        return ref + self.masked(v - ref).sum(1, keepdim=True) / self.n.clamp(min=1)

    def sample_std(self, v: torch.Tensor) -> torch.Tensor:
        centered = self.masked(v - self.mean(v))
        return torch.sqrt((centered ** 2).sum(1, keepdim=True) / (self.n - 1).clamp(min=1))


# ----------------------------------------------------------------------------- estimators

def maxk_weights(sg: SortedGroups, d, o) -> torch.Tensor:
    """PKPO s_i (spec 2.2): s_j = d_j x_j + sum_{t>j} o_t x_t."""
    return d * sg.x + suffix_exclusive(o * sg.x)


def maxk_of_rest(sg: SortedGroups, k: torch.Tensor) -> torch.Tensor:
    """max@k estimate of the group without sample j, for every sorted position j (spec 2.3):
    sum_{t<j} w'_t x_t + sum_{t>j} w'_{t-1} x_t with w' = d^(n-1,k). group_math.h and the Triton
    kernel (and the bank, spec 12.1) carry the factor c = k/(n-1) or k/n inside the tables:
    B_t = c w'_t and Bp_t = c w'_{t-1} (Triton: ``below`` and ``above``)."""
    w, _, _ = weight_tables((sg.sizes - 1).clamp(min=0), k, sg.width)
    return prefix_exclusive(w * sg.x) + suffix_inclusive(w * shift_left(sg.x))


def rloo_sum(sg: SortedGroups) -> torch.Tensor:
    """(x_j - mean of the others) / n = (x_j - mean) / (n - 1); 0 for singletons."""
    return torch.where(sg.n > 1, (sg.x - sg.mean(sg.x)) / (sg.n - 1).clamp(min=1), torch.zeros_like(sg.x))


def maxk_loo1(sg: SortedGroups, k: torch.Tensor, d, o) -> torch.Tensor:
    """PKPO s^(loo-1) (spec 2.4), shifted by the group minimum; k = 1: RLOO / n.

    d_j y_j - sum_{t<j} B_t y_t with B_t = o_{t+1} = (k/n) d^(n-1,k-1)_t: group_math.h builds B
    from d^(n-1,k-1) with the factor c = k/n, the Triton kernel (``below``) from d^(n,k) at rank
    t+1, the bank (spec 12.1) stores it; all three are the same table.
    """
    y = sg.masked(sg.x - sg.x[:, :1])
    loo1 = d * y - prefix_exclusive(shift_left(o) * y)
    return torch.where(k[:, None] == 1, rloo_sum(sg), loo1)


def maxk_offpolicy(sg: SortedGroups, d, o, q) -> torch.Tensor:
    """Bagirov first-order off-policy weights, O(n) form of spec 3.2."""
    x, delta = sg.x, sg.deltas
    D = prefix_exclusive(delta)
    S1 = suffix_exclusive(o * x)
    S2 = suffix_exclusive(o * delta * x)
    S3 = suffix_exclusive(q * D * x)
    S4 = suffix_exclusive(q * x)
    return (1 + delta) * (d * x + S1) + o * D * x + S2 + S3 - delta * S4


def _prefix_symmetric_means(r: torch.Tensor, valid: torch.Tensor, m_max: int) -> torch.Tensor:
    """E[:, j, m] = e_m(r_1..r_j) / C(j, m) for the first j sorted ratios (j = 0..width-1).

    e_m / C(p, m) is the mean of the products over m-subsets; adding one element is a convex
    combination (spec 3.4 numerics), so there is no cancellation and no overflow.
    """
    G, width = r.shape
    E = torch.zeros(G, width, m_max + 1, dtype=torch.float64, device=r.device)
    state = torch.zeros(G, m_max + 1, dtype=torch.float64, device=r.device)
    state[:, 0] = 1.0
    m = torch.arange(m_max + 1, dtype=torch.float64, device=r.device)
    for j in range(width):
        E[:, j] = state
        state = _add_element(state, r[:, j:j + 1], j, m)
    return E


def _add_element(state: torch.Tensor, r: torch.Tensor, p, m: torch.Tensor) -> torch.Tensor:
    """Symmetric means of a p-element set -> of the set plus r (batched over the leading dims;
    p is an int or a tensor that broadcasts against state)."""
    p1 = p + 1
    lower = F.pad(state[..., :-1], (1, 0))
    return flush_subnormal(((p1 - m) / p1) * state + (m / p1) * r * lower)


def flush_subnormal(t: torch.Tensor) -> torch.Tensor:
    """Zero values below float64's normal range: products of many small ratios get there, they are
    far below the result's resolution, and subnormal arithmetic is about 100x slower on CPUs."""
    return t.masked_fill(t.abs() < torch.finfo(torch.float64).tiny, 0.0)


def offpolicy_exact_weights_sorted(sg: SortedGroups, k: torch.Tensor):
    """Exact product-of-ratios weights (spec 3.4) and the objective J, in sorted order.

    A_(i) = rho_i [ d_i x_i E_{k-1}(P_i) + sum_{j>i} o_j rho_j x_j E_{k-2}(P_j without i) ],
    J = sum_j d_j rho_j x_j E_{k-1}(P_j), with E the symmetric means of P_j = {rho_l : l < j}.
    Ratios are divided by the group's largest ratio c (A and J are homogeneous of degree k in rho)
    and c^k is multiplied back at the end. Cost O(n^2 k) per group.
    """
    rho = sg.masked(1.0 + sg.deltas)
    c = rho.max(1, keepdim=True).values.clamp(min=torch.finfo(torch.float64).tiny)
    r = rho / c
    d, o, _ = weight_tables(sg.sizes, k, sg.width)
    G, width = r.shape
    kk = k[:, None].to(torch.int64)
    m_max = int(k.max()) if k.numel() else 1
    prefix = _prefix_symmetric_means(r, sg.valid, m_max)          # [G, width, m_max + 1]
    e_km1 = torch.gather(prefix, 2, (kk - 1).clamp(min=0)[:, :, None].expand(G, width, 1))[..., 0]
    diag = d * sg.x * e_km1
    objective = (diag * r).sum(1)

    # For every i, walk j = i+1, i+2, ... keeping the symmetric means of P_j without i.
    state = prefix.clone()                                          # P_{i+1} \ {i} = P_i
    m = torch.arange(m_max + 1, dtype=torch.float64, device=r.device)
    index_km2 = (kk - 2).clamp(min=0)[:, :, None].expand(G, width, 1)
    off_diag = torch.zeros_like(r)
    rows = torch.arange(width, device=r.device)
    for step in range(1, width):
        j = rows + step                                             # j for every i; j < width is real
        live = j < width
        jj = j.clamp(max=width - 1)
        w = torch.where(live[None, :], (o * r * sg.x)[:, jj], torch.zeros_like(r))
        e_km2 = torch.gather(state, 2, index_km2)[..., 0]
        off_diag = off_diag + w * e_km2
        # add r_j to the set; P_j without i has j - 2 elements (0-based j: j - 1 elements)
        size = (jj - 1).to(torch.float64)[None, :, None]
        state = torch.where(live[None, :, None], _add_element(state, r[:, jj][:, :, None], size, m), state)
    off_diag = torch.where(k[:, None] >= 2, off_diag, torch.zeros_like(off_diag))
    scale = c ** k.to(torch.float64)[:, None]
    weights = sg.masked(scale * r * (diag + off_diag))
    return weights, objective * scale[:, 0]


def tang_loo(sg: SortedGroups) -> torch.Tensor:
    """max - max of the others: only the top sorted position gets x_n - x_{n-1}."""
    last = (sg.sizes - 1).clamp(min=0)[:, None]
    second = torch.gather(sg.x, 1, (last - 1).clamp(min=0))
    cols = torch.arange(sg.width, device=sg.x.device)[None, :]
    gap = torch.where(sg.n > 1, sg.top() - second, torch.zeros_like(second))
    return torch.where(cols == last, gap.expand_as(sg.x), torch.zeros_like(sg.x))


def bon_max_mean(sg: SortedGroups) -> torch.Tensor:
    at_max = sg.valid & (sg.x == sg.top())
    return torch.where(at_max, sg.x - sg.mean(sg.x), torch.zeros_like(sg.x))


def bon_max_second(sg: SortedGroups) -> torch.Tensor:
    top = sg.top()
    below = sg.valid & (sg.x < top)
    second = torch.where(below, sg.x, torch.full_like(sg.x, -math.inf)).max(1, keepdim=True).values
    has_second = below.any(1, keepdim=True)
    at_max = sg.valid & (sg.x == top) & has_second
    return torch.where(at_max, top - second, torch.zeros_like(sg.x))


def zscore(sg: SortedGroups, v: torch.Tensor, eps: float, constant_rtol: float = 0.0) -> torch.Tensor:
    """(v - mean) / (std + eps), std the sample std (divisor n - 1), the mean taken around the
    group's first element (spec 3.3, 13.1); 0 for singletons and when std <= constant_rtol * scale,
    scale = max|v| (the constant-group guard of bon_mean). Same names in group_math.h
    (zscore_emit) and the Triton kernel (branches BON_MEAN, GRPO)."""
    # First divide by a power of two near the group's largest |v| (exact), so residues and their
    # squares cannot overflow at the edge of the float range (values like +-1.7e308); away from
    # that edge every step is the unscaled formula times the same power of two, bit for bit.
    largest = sg.masked(v.abs()).max(1, keepdim=True).values
    exponent = torch.frexp(largest).exponent
    factor = torch.where(largest > 0, torch.ldexp(torch.ones_like(largest), exponent - 1), torch.ones_like(largest))
    u = v / factor
    std = sg.sample_std(u)
    scale = largest / factor
    constant = (sg.n < 2) | (std <= constant_rtol * scale)
    return torch.where(constant, torch.zeros_like(v), (u - sg.mean(u)) / (std + eps / factor))


def chen_passk(sg: SortedGroups, k: torch.Tensor, d, eps: float) -> torch.Tensor:
    """Chen et al. analytic pass@k advantage (spec 6) = ((n/k) s_i - R) / (sigma + eps).

    Written with the failure probabilities miss_k = 1 - R = C(n-c,k)/C(n,k) and, for a wrong
    sample, miss_rest = 1 - (n/k) s_i = C(n-1-c,k-1)/C(n-1,k-1), each a sum of table entries: no
    cancellation when R is close to 1 (large n, few failures). Same names in group_math.h (case
    CHEN_PASSK) and the Triton kernel (branch CHEN_PASSK):

        sigma = sqrt((1 - miss_k) miss_k),  a_pos = miss_k / (sigma + eps),
        a_neg = (miss_k - miss_rest) / (sigma + eps),  0 where R is exactly 0 or 1
    """
    wrong = sg.valid & (sg.x == 0)
    miss_k = (d * wrong).sum(1, keepdim=True)                              # 1 - R
    n_wrong = wrong.sum(1, keepdim=True)
    kk = k.to(torch.float64)[:, None]
    d_rest, _, _ = weight_tables((sg.sizes - 1).clamp(min=0), (k - 1).clamp(min=1), sg.width)
    ranks = torch.arange(1, sg.width + 1, device=sg.x.device)[None, :]
    miss_rest = torch.where(kk == 1, torch.ones_like(miss_k),              # 1 - (n/k) s_i, wrong i
                            (d_rest * (ranks < n_wrong)).sum(1, keepdim=True))
    sigma = torch.sqrt((1 - miss_k) * miss_k)
    a_pos = miss_k / (sigma + eps)
    a_neg = (miss_k - miss_rest) / (sigma + eps)
    value = torch.where(sg.x == 1, a_pos, a_neg)
    degenerate = (n_wrong == sg.n) | (n_wrong < kk)                         # R is exactly 0 or 1
    return torch.where(degenerate, torch.zeros_like(value), value)


def bon_rlb(sg: SortedGroups, k: torch.Tensor, d, two_sided: bool) -> torch.Tensor:
    """Chow et al. BoN-RLB averaged over the k-subsets of the group (spec 4, docs/conventions.md),
    sum scale. Same names in group_math.h (case BON_RLB) and the Triton kernel (branch BON_RLB):

        R = pass@k estimate = sum_j d_j x_j,  c = successes,  p_fail = (n - c)/n (plug-in)
        bon_rlb:      w_plus = k p^(k-1) / (1 - p^k),  w_minus = k p / (1 - p)  (+inf at p = 1)
        bon_rlb_pos:  w_plus = k p^(k-1) / geometric,  geometric = 1 + p + ... + p^(k-1),  w_minus = 0
        correct_weight = w_plus R / c,  wrong_weight = w_minus (1 - R) / (n - c)
    """
    R = (d * sg.x).sum(1, keepdim=True)
    c = sg.masked(sg.x).sum(1, keepdim=True)
    n = sg.n.clamp(min=1)
    p_fail = (n - c) / n
    kk = k.to(torch.float64)[:, None]
    p_km1 = p_fail ** (kk - 1)
    one_minus_pk = -torch.expm1(kk * torch.log(p_fail))            # 1 - p^k, accurate near p = 1
    one_minus_p = (1 - p_fail).clamp(min=1e-300)
    geometric = torch.where(p_fail < 1, one_minus_pk / one_minus_p, kk)  # 1 + p + ... + p^(k-1)
    if two_sided:
        w_plus = kk * p_km1 / one_minus_pk.clamp(min=1e-300)
        w_minus = torch.where(p_fail < 1, kk * p_fail / one_minus_p, torch.full_like(p_fail, math.inf))
    else:
        w_plus = kk * p_km1 / geometric
        w_minus = torch.zeros_like(p_fail)
    correct_weight = w_plus * R / c.clamp(min=1)
    wrong_weight = w_minus * (1 - R) / (n - c).clamp(min=1)
    return torch.where(sg.x == 1, correct_weight, wrong_weight)


# ----------------------------------------------------------------------------- the op

def effective_k(sizes: torch.Tensor, k: int, est: estimators.Estimator, small_groups: int):
    """Per-group k after the too-small rule, and the groups whose outputs are forced to 0."""
    k_max = sizes - est.k_margin
    kk = torch.full_like(sizes, k)
    if not est.uses_k:
        return kk, torch.zeros_like(sizes, dtype=torch.bool)
    too_small = kk > k_max
    if small_groups == 2:                      # clamp
        kk = torch.where(too_small, k_max, kk)
        zero = kk < 1
    else:                                      # zero (error mode was checked before the call)
        zero = too_small
    return kk.clamp(min=1), zero


def maxrl(sg: SortedGroups) -> torch.Tensor:
    """MaxRL (spec 12), mean scale: (x_i - mean) / mean, 0 when the mean is 0.

    A singleton gives (x - x) / x = 0: its mean is its own reward, so nothing is learned from it.
    """
    m = sg.mean(sg.x)
    return torch.where(m != 0, (sg.x - m) / torch.where(m != 0, m, torch.ones_like(m)), torch.zeros_like(sg.x))


# ----------------------------------------------------------------------------- mixtures over k (bank mode)

class BankTables:
    """The mixed tables of every group, read from the bank (see bonkernels/tables.py), [G, width]."""

    def __init__(self, sg: SortedGroups, bank: torch.Tensor, bank_index: torch.Tensor):
        sizes = sg.sizes
        limit = bank_index.numel() - 1
        start = bank_index[sizes.clamp(max=max(limit, 0))]
        has = (sizes <= limit) & (start >= 0)
        start = torch.where(has, start, torch.zeros_like(start))[:, None]
        n = sizes[:, None]
        cols = torch.arange(sg.width, device=sizes.device)[None, :]
        live = sg.valid & has[:, None]

        def row(r):
            index = (start + r * n + cols).clamp(max=bank.numel() - 1)
            return torch.where(live, bank.to(torch.float64)[index], torch.zeros(1, dtype=torch.float64,
                                                                                 device=bank.device))
        self.D, self.O, self.Q, self.B, self.Bp = (row(r) for r in range(5))
        w1_index = (start[:, 0] + 5 * sizes).clamp(max=bank.numel() - 1)
        self.W1 = torch.where(has, bank.to(torch.float64)[w1_index], torch.zeros_like(bank[:1].to(torch.float64)))[:, None]


def bank_values(sg: SortedGroups, est: estimators.Estimator, t: BankTables) -> torch.Tensor:
    """A linear estimator's mixture weights in natural (sum) scale, sorted order (spec 12)."""
    name, x = est.name, sg.x
    if name in ("maxk", "passk"):
        return maxk_weights(sg, t.D, t.O)
    if name in ("maxk_loo", "maxk_loo_centered"):
        return maxk_weights(sg, t.D, t.O) - (prefix_exclusive(t.B * x) + suffix_exclusive(t.Bp * x))
    if name == "maxk_loo1":
        y = sg.masked(x - x[:, :1])
        return t.D * y - prefix_exclusive(t.B * y) + t.W1 * rloo_sum(sg)
    if name == "maxk_offpolicy":
        return maxk_offpolicy(sg, t.D, t.O, t.Q)
    raise ValueError(f"estimator {name!r} has no mixture tables (k_weights)")


def natural_values(sg: SortedGroups, est: estimators.Estimator, k: torch.Tensor, eps: float) -> torch.Tensor:
    """The estimator's values in its natural scale, sorted order, [G, width]."""
    name = est.name
    if name == "maxrl":
        return maxrl(sg)
    # Estimators that need no weight tables.
    if name == "grpo":
        return zscore(sg, sg.x, eps)
    if name == "rloo":
        return rloo_sum(sg) * sg.n
    if name == "dr_grpo":
        return sg.x - sg.mean(sg.x)
    if name == "tang_loo":
        return tang_loo(sg)
    if name == "bon_max_mean":
        return bon_max_mean(sg)
    if name == "bon_max_second":
        return bon_max_second(sg)
    if name == "maxk_offpolicy_exact":
        return offpolicy_exact_weights_sorted(sg, k)[0]
    d, o, q = weight_tables(sg.sizes, k, sg.width)
    if name in ("maxk", "passk"):
        return maxk_weights(sg, d, o)
    if name == "maxk_loo":
        return maxk_weights(sg, d, o) - k[:, None] / (sg.n - 1).clamp(min=1) * maxk_of_rest(sg, k)
    if name == "maxk_loo_centered":
        return maxk_weights(sg, d, o) - k[:, None] / sg.n.clamp(min=1) * maxk_of_rest(sg, k)
    if name == "maxk_loo1":
        return maxk_loo1(sg, k, d, o)
    if name == "maxk_offpolicy":
        return maxk_offpolicy(sg, d, o, q)
    if name == "bon_mean":
        return zscore(sg, maxk_weights(sg, d, o), eps, estimators.ZSCORE_CONSTANT_RTOL)
    if name == "chen_passk":
        return chen_passk(sg, k, d, eps)
    if name in ("bon_rlb", "bon_rlb_pos"):
        return bon_rlb(sg, k, d, two_sided=name == "bon_rlb") * sg.n
    raise ValueError(f"estimator {name!r} has no reference implementation")


def advantages_packed(values: torch.Tensor, offsets: torch.Tensor, deltas: Optional[torch.Tensor], k: int,
                      estimator_code: int, clamp_delta: Optional[float], clip_lo: float, clip_hi: float,
                      mean_scale: bool, small_groups: int, eps: float,
                      max_group_size: Optional[int] = None, bank: Optional[torch.Tensor] = None,
                      bank_index: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The backend interface (see docs/conventions.md): packed [N] in, packed [N] out.

    With ``bank``/``bank_index`` (a mixture over k, spec 12) the estimator's tables come from the
    bank, k is ignored, and no group is zeroed here (the too-small rule is folded into the bank).
    """
    est = estimators.by_code(estimator_code)
    if est.needs_deltas:
        if clamp_delta is not None:
            deltas = deltas.clamp(-clamp_delta, clamp_delta)
    else:
        deltas = None
    sizes = offsets[1:] - offsets[:-1]
    if est.name == "maxk_offpolicy_exact" and sizes.numel() and int(sizes.max()) > OFFPOLICY_EXACT_MAX_N:
        g = int((sizes > OFFPOLICY_EXACT_MAX_N).nonzero()[0])
        raise ValueError(f"maxk_offpolicy_exact supports groups of at most {OFFPOLICY_EXACT_MAX_N} samples "
                         f"(its cost is O(n^2 k) per group); group {g} has {int(sizes[g])}")
    sg = SortedGroups(values, offsets, deltas)   # max_group_size is not needed: see SortedGroups
    if bank is not None:
        zero = torch.zeros_like(sg.sizes, dtype=torch.bool)
        a = bank_values(sg, est, BankTables(sg, bank, bank_index))
    else:
        kk, zero = effective_k(sg.sizes, k, est, small_groups)
        a = natural_values(sg, est, kk, eps)
    if mean_scale and est.scale == "sum":
        a = a * sg.n
    elif not mean_scale and est.scale == "mean":
        a = a / sg.n.clamp(min=1)
    a = torch.where(zero[:, None], torch.zeros_like(a), a)
    a = a.clamp(clip_lo, clip_hi)
    a = sg.masked(a)
    if est.name == "maxk_offpolicy_exact" and not bool(torch.isfinite(a).all()):
        raise ValueError("maxk_offpolicy_exact overflowed float64: the ratios are too large; "
                         "pass clamp_delta to bound them")
    return sg.scatter_back(a).to(values.dtype)


# ----------------------------------------------------------------------------- metrics and objective

def max_at_k_packed(values: torch.Tensor, offsets: torch.Tensor, k: int, small_groups: int = 0,
                    bank: Optional[torch.Tensor] = None, bank_index: Optional[torch.Tensor] = None,
                    exact_width: Optional[int] = None) -> torch.Tensor:
    """Unbiased max@k per group (spec 1.2), float64 [G]; 0 for empty or zeroed groups.

    With a bank (built for "maxk"): the mixed metric sum_k w_k max@k = sum_j D_j x_j (spec 12).
    ``exact_width``: every group has this size (no host sync to find it).
    """
    sg = SortedGroups(values, offsets, exact_width=exact_width)
    if bank is not None:
        return (BankTables(sg, bank, bank_index).D * sg.x).sum(1)
    kk, zero = effective_k(sg.sizes, k, estimators.get("maxk"), small_groups)
    d, _, _ = weight_tables(sg.sizes, kk, sg.width)
    estimate = (d * sg.x).sum(1)
    return torch.where(zero | (sg.sizes == 0), torch.zeros_like(estimate), estimate)


def offpolicy_exact_weights(values: torch.Tensor, offsets: torch.Tensor, rho: torch.Tensor, k: int) -> torch.Tensor:
    """Exact off-policy weights A^exact (spec 3.4, sum scale), float64 [N] in packed order."""
    sg = SortedGroups(values, offsets, deltas=rho - 1.0)
    weights, _ = offpolicy_exact_weights_sorted(sg, torch.full_like(sg.sizes, k))
    return sg.scatter_back(weights)


def importance_weighted_maxk(values: torch.Tensor, offsets: torch.Tensor, rho: torch.Tensor, k: int) -> torch.Tensor:
    """J(rho) = (1/C(n,k)) sum_{|I|=k} (prod_{l in I} rho_l) max_I g per group (spec 3.4), float64 [G].

    Its gradient with respect to log rho_i is A^exact_i.
    """
    sg = SortedGroups(values, offsets, deltas=rho - 1.0)
    _, objective = offpolicy_exact_weights_sorted(sg, torch.full_like(sg.sizes, k))
    return objective
