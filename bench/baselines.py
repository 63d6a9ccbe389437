"""The papers' own algorithms and the trainers' status quo, written plainly in PyTorch.

These are the competitors of ``bk.advantages`` in the benchmarks: code a user would write by
copying the papers' listings or a trainer's estimator, not tuned code. Each one returns the same
values as ``bk.advantages(..., scale="sum")`` for its estimator (``python_tests/
test_bench_baselines.py`` checks that), so every comparison is like for like.

* ``pkpo_listing``: PKPO (Walder & Karkhanis) Listing 1 ported to PyTorch, one group at a time.
  The weight tables are rebuilt for every group from O(k) ratio products, as in the listing, so
  a group costs O(nk + n log n) and, above all, O(n) small tensor operations.
  ``pkpo_listing_cached`` is the same per-group loop with the tables memoised per (n, k), the first
  thing a careful user would add.
* ``maxk_matrix``: Bagirov et al.'s n x n weight matrix (their Listings 2 and 3): binomials via
  ``lgamma``, the on-policy matrix shared by all groups and applied as one matrix product, the
  off-policy matrix built per group (it depends on the deltas) in chunks of groups. O(n^2) per group.
* ``verl_loop``: a per-sample Python loop over a dict of group ids, as verl's
  ``compute_grpo_outcome_advantage`` does; for PKPO, the same grouping with Listing 1 per group.

Everything is computed in float64 (the listings' numpy default) and cast back to the rewards'
dtype. Outputs are in the spec's sum scale (grad = sum_i A_i grad log p_i), except GRPO, whose
natural scale is the mean scale (as in verl).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# PKPO Listing 1, ported to PyTorch (0-based sorted ranks i, j as in the listing).
# ----------------------------------------------------------------------------------------------

def _m_normed(N: int, K: int, i: int, j: int) -> float:
    """m_ij / C(N, K) as a product of K-1 ratios (the listing's corrected Eq. 14)."""
    if i == j and i >= K - 1:
        return K / (N - K + 1) * torch.prod(
            torch.arange(i - K + 2, i + 1, dtype=F64) / torch.arange(N - K + 2, N + 1, dtype=F64)
        ).item()
    if j > i and j >= K - 1 and K >= 2:
        return K / (N - K + 1) * (K - 1) / N * torch.prod(
            torch.arange(j - K + 2, j, dtype=F64) / torch.arange(N - K + 2, N, dtype=F64)
        ).item()
    return 0.0


def _m_diagonal(N: int, K: int) -> torch.Tensor:
    return torch.tensor([_m_normed(N, K, i, i) for i in range(N)], dtype=F64)


def _delta(N: int, K: int, i: int) -> float:
    return _m_normed(N, K, i, i + 1) - _m_normed(N, K, i + 1, i + 1)


def _deltas(N: int, K: int) -> torch.Tensor:
    return torch.tensor([_delta(N - 1, K, i) for i in range(N - 2)], dtype=F64)


@functools.lru_cache(maxsize=None)
def _m_diagonal_cached(N: int, K: int) -> torch.Tensor:
    return _m_diagonal(N, K)


@functools.lru_cache(maxsize=None)
def _deltas_cached(N: int, K: int) -> torch.Tensor:
    return _deltas(N, K)


def _sorted_apply(func):
    """Sort the group, apply ``func`` in sorted order, scatter back (the listing's decorator)."""

    def inner(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        i_sort = torch.argsort(x)
        out = torch.zeros_like(x)
        out[i_sort] = func(x[i_sort], *args, **kwargs)
        return out

    return inner


def _s_sorted(g: torch.Tensor, K: int, cached: bool) -> torch.Tensor:
    """PKPO Eq. 19 on sorted rewards: a right-to-left cumulative sum."""
    diag, deltas = (_m_diagonal_cached, _deltas_cached) if cached else (_m_diagonal, _deltas)
    N = len(g)
    c = g * diag(N, K).to(g.device)
    c[: N - 1] += g[1:] * deltas(N + 1, K).to(g.device)
    return torch.flip(torch.cumsum(torch.flip(c, [0]), 0), [0])


def _b_sorted(g: torch.Tensor, K: int, cached: bool) -> torch.Tensor:
    """b_i^(K) = sum_{j != i} S(j, K, [n] minus i), the listing's leave-one-out helper."""
    diag, deltas = (_m_diagonal_cached, _deltas_cached) if cached else (_m_diagonal, _deltas)
    N = len(g)
    w = diag(N - 1, K).to(g.device) * torch.arange(1, N, dtype=F64, device=g.device)
    w[1:] += deltas(N, K).to(g.device) * torch.arange(1, N - 1, dtype=F64, device=g.device)
    c1 = (w * g[1:]).sum().reshape(1)
    c2 = (g[:-1] - g[1:]) * w
    return torch.cumsum(torch.cat((c1, c2)), 0)


_s = _sorted_apply(_s_sorted)
_b = _sorted_apply(_b_sorted)


def pkpo_s(g: torch.Tensor, K: int, cached: bool = False) -> torch.Tensor:
    """PKPO s_i (Eq. 19) for one group: the listing's ``s``."""
    return _s(g.to(F64), K, cached)


def pkpo_sloo_minus_one(g: torch.Tensor, K: int, cached: bool = False) -> torch.Tensor:
    """PKPO s^(loo-1) (Eq. 33) for one group: the listing's ``sloo_minus_one``.

    The listing divides by K - 1; for K = 1 this uses the paper's own k = 1 baseline (Eq. 26),
    g_i - mean of the others, divided by n for the sum scale (the library's convention).
    """
    g = g.to(F64)
    N = len(g)
    if K == 1:
        if N == 1:
            return torch.zeros_like(g)
        return (g - (g.sum() - g) / (N - 1)) / N
    return _s(g, K, cached) - _b(g, K - 1, cached) * K / (K - 1) / N


_PKPO_GROUP_FNS = {"maxk": pkpo_s, "maxk_loo1": pkpo_sloo_minus_one}


def pkpo_listing(rewards: torch.Tensor, offsets: torch.Tensor, k: int, estimator: str,
                 cached: bool = False) -> torch.Tensor:
    """Listing 1 applied to each group of a packed batch, one Python iteration per group."""
    fn = _PKPO_GROUP_FNS[estimator]
    out = torch.empty_like(rewards)
    bounds = offsets.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out[start:end] = fn(rewards[start:end], k, cached).to(rewards.dtype)
    return out


# ----------------------------------------------------------------------------------------------
# Bagirov et al.: the n x n weight matrix (Listings 2 and 3), O(n^2) per group.
# ----------------------------------------------------------------------------------------------

def _log_binom(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)


def _binom_over_cnk(a: torch.Tensor, b: int, n: int, k: int) -> torch.Tensor:
    """C(a, b) / C(n, k) elementwise, combinatorial convention (0 unless 0 <= b <= a).

    The listings divide ``binom(a, b)`` by ``binom(n, k)``; that overflows float64 near n = 1030,
    so the ratio is taken in log space (same O(n^2) work, values correct for every n).
    """
    bt = torch.full_like(a, float(b))
    log_c_nk = _log_binom(torch.tensor(float(n), dtype=F64), torch.tensor(float(k), dtype=F64))
    valid = (bt >= 0) & (a >= bt)
    safe_a = torch.where(valid, a, bt.clamp(min=0))
    ratio = torch.exp(_log_binom(safe_a, bt.clamp(min=0)) - log_c_nk)
    return torch.where(valid, ratio, torch.zeros_like(ratio))


def _rank_grids(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    r = torch.arange(1, n + 1, dtype=F64, device=device)
    return r[:, None], r[None, :]  # 1-based sorted ranks i (rows) and j (columns)


def maxk_matrix_onpolicy(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Bagirov Listing 2 (= PKPO s_i) for full rows [G, n]: r~ = W g_sorted / C(n, k).

    W[i, i] = C(i-1, k-1), W[i, j] = C(j-2, k-2) for j > i; W depends only on (n, k), so one
    matrix serves every group and the batch is one [G, n] x [n, n] product.
    """
    G, n = rewards.shape
    g, perm = torch.sort(rewards.to(F64), dim=1)
    i, j = _rank_grids(n, rewards.device)
    diag = _binom_over_cnk(i - 1, k - 1, n, k).expand(n, n)
    off = _binom_over_cnk(j - 2, k - 2, n, k).expand(n, n)
    W = torch.where(i == j, diag, torch.where(j > i, off, torch.zeros_like(off)))
    out_sorted = g @ W.T
    out = torch.empty_like(out_sorted).scatter_(1, perm, out_sorted)
    return out.to(rewards.dtype)


def maxk_matrix_offpolicy(rewards: torch.Tensor, deltas: torch.Tensor, k: int,
                          clamp_delta: float | None = None,
                          max_chunk_elems: int = 1 << 22) -> torch.Tensor:
    """Bagirov Listing 3 (first-order off-policy weights) for full rows [G, n].

    In sorted order, with D_j = sum_{l<j} delta_l (exclusive cumulative sum):
      W'[i, i] = C(i-1, k-1)(1 + d_i) + C(i-2, k-2) D_i
      W'[i, j] = C(j-2, k-2)(1 + d_i + d_j) + C(j-3, k-3)(D_j - d_i)     (j > i)
      A'_i = sum_j W'[i, j] g_j / C(n, k)
    W' depends on the deltas, so it is built per group: [chunk, n, n] at a time to bound memory.
    """
    G, n = rewards.shape
    g, perm = torch.sort(rewards.to(F64), dim=1)
    d = torch.gather(deltas.to(F64), 1, perm)
    if clamp_delta is not None:
        d = torch.clamp(d, -clamp_delta, clamp_delta)
    D = torch.cumsum(d, dim=1) - d
    i, j = _rank_grids(n, rewards.device)
    c_diag1 = _binom_over_cnk(i - 1, k - 1, n, k).reshape(n)      # C(i-1,k-1)/C(n,k)
    c_diag2 = _binom_over_cnk(i - 2, k - 2, n, k).reshape(n)      # C(i-2,k-2)/C(n,k)
    c_off1 = _binom_over_cnk(j - 2, k - 2, n, k).expand(n, n)     # C(j-2,k-2)/C(n,k)
    c_off2 = _binom_over_cnk(j - 3, k - 3, n, k).expand(n, n)     # C(j-3,k-3)/C(n,k)
    upper = (j > i).to(F64)
    eye = torch.eye(n, dtype=F64, device=rewards.device)
    out_sorted = torch.empty_like(g)
    chunk = max(1, max_chunk_elems // (n * n))
    for s in range(0, G, chunk):
        dc, Dc, gc = d[s:s + chunk], D[s:s + chunk], g[s:s + chunk]
        di, dj, Dj = dc[:, :, None], dc[:, None, :], Dc[:, None, :]
        off = upper * (c_off1 * (1 + di + dj) + c_off2 * (Dj - di))
        diag = c_diag1 * (1 + dc) + c_diag2 * Dc
        W = off + eye * diag[:, :, None]
        out_sorted[s:s + chunk] = torch.bmm(W, gc[:, :, None]).squeeze(2)
    out = torch.empty_like(out_sorted).scatter_(1, perm, out_sorted)
    return out.to(rewards.dtype)


# ----------------------------------------------------------------------------------------------
# The trainers' status quo: verl's per-sample loop over a dict of group ids.
# ----------------------------------------------------------------------------------------------

def verl_grpo(scores: torch.Tensor, index, epsilon: float = 1e-6) -> torch.Tensor:
    """verl's ``compute_grpo_outcome_advantage`` on scalar scores (no token dimension)."""
    scores = scores.clone()
    id2score = defaultdict(list)
    id2mean = {}
    id2std = {}
    with torch.no_grad():
        bsz = scores.shape[0]
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            else:
                scores_tensor = torch.stack(id2score[idx])
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
        for i in range(bsz):
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return scores


def verl_pkpo(scores: torch.Tensor, index, k: int, estimator: str = "maxk_loo1") -> torch.Tensor:
    """The same dict grouping with PKPO Listing 1 applied per group (how a verl user plugs it in)."""
    fn = _PKPO_GROUP_FNS[estimator]
    out = torch.empty_like(scores)
    id2score = defaultdict(list)
    id2indices = defaultdict(list)
    with torch.no_grad():
        for i in range(scores.shape[0]):
            id2score[index[i]].append(scores[i])
            id2indices[index[i]].append(i)
        for idx in id2score:
            advantages = fn(torch.stack(id2score[idx]), k)
            for j, i in enumerate(id2indices[idx]):
                out[i] = advantages[j]
    return out
