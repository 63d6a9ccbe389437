"""Independent brute-force oracle for every estimator, per group.

Written from the spec (docs/spec.md) and docs/conventions.md only, never from the
library's code, so that a wrong formula in the library cannot also be in here. Two kinds of
definitions:

* ``enumerate_*`` / :func:`natural`: the definitions themselves, by enumeration over all k-subsets
  (itertools.combinations) in exact rational arithmetic (``fractions.Fraction``; z-scores take one
  float square root). Exponential cost: meant for n <= 8 or so.
* ``closed_*`` / :func:`natural_closed`: the spec's sorted closed forms with exact big-integer
  binomials, evaluated in float64 numpy, for large n (checked against the enumeration in the tests).

Every function takes one group (a sequence of floats, in sample order) and returns its values in
sample order, in the estimator's *natural* scale (:data:`NATURAL_SCALE`, which the tests check
against the library's registry); :func:`expected` converts to the requested scale and clips.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import time
from fractions import Fraction
from itertools import combinations

import numpy as np

# The scale each estimator's defining formula gives (spec 0, "Scale convention").
NATURAL_SCALE = {
    "maxk": "sum", "maxk_loo": "sum", "maxk_loo_centered": "sum", "maxk_loo1": "sum",
    "maxk_offpolicy": "sum", "maxk_offpolicy_exact": "sum", "passk": "sum", "tang_loo": "sum",
    "bon_max_mean": "mean", "bon_max_second": "mean", "bon_mean": "mean", "chen_passk": "mean",
    "bon_rlb": "mean", "bon_rlb_pos": "mean", "grpo": "mean", "rloo": "mean", "dr_grpo": "mean",
    "maxrl": "mean",
}
ALL_ESTIMATORS = tuple(NATURAL_SCALE)
K_IGNORED = frozenset({"tang_loo", "bon_max_mean", "bon_max_second", "grpo", "rloo", "dr_grpo", "maxrl"})
NON_NEGATIVE = frozenset({"maxrl"})      # rewards must be >= 0
BINARY_ONLY = frozenset({"passk", "chen_passk", "bon_rlb", "bon_rlb_pos"})
OFF_POLICY = frozenset({"maxk_offpolicy", "maxk_offpolicy_exact"})
LOO_NEEDS_REST = frozenset({"maxk_loo", "maxk_loo_centered"})  # k <= n - 1
BON_RLB_DEFAULT_CLIP = (-100.0, 100.0)  # conventions.md: bon_rlb's clip when clip is None
ZSCORE_CONSTANT_RTOL = 1e-10  # conventions.md: bon_mean is 0 when std(s) <= 1e-10 max|s|


def fresh_seed() -> int:
    """A new seed per run (override with BONKERNELS_TEST_SEED to replay a failure)."""
    env = os.environ.get("BONKERNELS_TEST_SEED")
    return int(env) if env else time.time_ns() % (2**32)


def comb(a: int, b: int) -> int:
    """Combinatorial binomial: 0 unless 0 <= b <= a (also for negative a)."""
    return math.comb(a, b) if 0 <= b <= a else 0


def k_max(name: str, n: int) -> int:
    """Largest valid k for a group of size n (conventions.md); k-ignoring estimators: no limit."""
    if name in K_IGNORED:
        return 10**9
    return n - 1 if name in LOO_NEEDS_REST else n


def _fr(values) -> list[Fraction]:
    return [Fraction(float(v)) for v in values]


def _avg(xs) -> Fraction:
    xs = list(xs)
    return sum(xs, Fraction(0)) / len(xs)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

def max_at_k(g, k: int) -> Fraction:
    """Unbiased max@k (spec 1.2): the average over all k-subsets of the subset's max."""
    g = _fr(g)
    return _avg(max(g[i] for i in I) for I in combinations(range(len(g)), k))


def pass_at_k(f, k: int) -> Fraction:
    """Unbiased pass@k (spec 1.1), binomial form 1 - C(n-c,k)/C(n,k); k = 0 gives 0."""
    n, c = len(f), int(sum(1 for v in f if v))
    if k == 0:
        return Fraction(0)
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def pass_at_k_product(f, k: int) -> float:
    """Stable product form (spec 1.1): 1 - prod_{i=n-c+1}^{n} (1 - k/i), or 1 when n - c < k."""
    n, c = len(f), int(sum(1 for v in f if v))
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# --------------------------------------------------------------------------------------------
# Enumeration definitions (sum-scale estimators)
# --------------------------------------------------------------------------------------------

def _subsets_with(n: int, k: int, i: int, pool=None):
    pool = range(n) if pool is None else pool
    return (I for I in combinations(pool, k) if i in I)


def enumerate_s(g, k: int) -> list[Fraction]:
    """PKPO s_i (spec 2.2): (1/C(n,k)) sum_{|I|=k, i in I} max_I g."""
    g = _fr(g)
    n = len(g)
    norm = Fraction(1, comb(n, k))
    return [norm * sum((max(g[j] for j in I) for I in _subsets_with(n, k, i)), Fraction(0))
            for i in range(n)]


def _S(g, j: int, k: int, pool) -> Fraction:
    """S(j, k, Set) of spec 2.3: (1/C(|Set|,k)) sum_{|I|=k, I within Set, j in I} max_I g."""
    total = sum((max(g[t] for t in I) for I in _subsets_with(len(g), k, j, pool)), Fraction(0))
    return total / comb(len(pool), k)


def enumerate_loo_paper(g, k: int) -> list[Fraction]:
    """PKPO Eq. 29 (spec 2.3): S(i,k,[n]) - (1/(n-1)) sum_{j != i} S(j,k,[n] without i)."""
    g = _fr(g)
    n = len(g)
    assert 1 <= k <= n - 1
    out = []
    for i in range(n):
        rest = [j for j in range(n) if j != i]
        base = sum((_S(g, j, k, rest) for j in rest), Fraction(0)) / (n - 1)
        out.append(_S(g, i, k, list(range(n))) - base)
    return out


def enumerate_loo_centered(g, k: int) -> list[Fraction]:
    """Centered leave-one-out (spec 2.3): s_i - (k/n) max@k(g without i), by enumeration."""
    gf = _fr(g)
    n = len(gf)
    assert 1 <= k <= n - 1
    s = enumerate_s(g, k)
    return [s[i] - Fraction(k, n) * max_at_k([float(v) for j, v in enumerate(gf) if j != i], k)
            for i in range(n)]


def enumerate_loo1(g, k: int) -> list[Fraction]:
    """PKPO s^(loo-1) (spec 2.4): (1/C(n,k)) sum_{I ni i} (max_I g - max_{I without i} g);
    k = 1 convention: (g_i - mean of the others)/n; n = 1, k = 1: 0."""
    g = _fr(g)
    n = len(g)
    if k == 1:
        if n == 1:
            return [Fraction(0)]
        tot = sum(g, Fraction(0))
        return [(g[i] - (tot - g[i]) / (n - 1)) / n for i in range(n)]
    norm = Fraction(1, comb(n, k))
    out = []
    for i in range(n):
        acc = Fraction(0)
        for I in _subsets_with(n, k, i):
            acc += max(g[j] for j in I) - max(g[j] for j in I if j != i)
        out.append(norm * acc)
    return out


def clamp_deltas(deltas, clamp_delta):
    deltas = _fr(deltas)
    if clamp_delta is None:
        return deltas
    c = Fraction(float(clamp_delta))
    return [min(max(d, -c), c) for d in deltas]


def enumerate_offpolicy(g, k: int, deltas, clamp_delta=None) -> list[Fraction]:
    """Bagirov first order (spec 3.2): (1/C(n,k)) sum_{I ni i} (1 + sum_{l in I} delta_l) max_I g."""
    g, dl = _fr(g), clamp_deltas(deltas, clamp_delta)
    n = len(g)
    norm = Fraction(1, comb(n, k))
    return [norm * sum(((1 + sum((dl[l] for l in I), Fraction(0))) * max(g[j] for j in I)
                        for I in _subsets_with(n, k, i)), Fraction(0))
            for i in range(n)]


def enumerate_offpolicy_exact(g, k: int, deltas, clamp_delta=None) -> list[Fraction]:
    """Exact importance weights (spec 3.2 / 3.4): (1/C(n,k)) sum_{I ni i} prod_{l in I} rho_l max_I g."""
    g, dl = _fr(g), clamp_deltas(deltas, clamp_delta)
    n = len(g)
    norm = Fraction(1, comb(n, k))
    return [norm * sum((math.prod((1 + dl[l] for l in I), start=Fraction(1)) * max(g[j] for j in I)
                        for I in _subsets_with(n, k, i)), Fraction(0))
            for i in range(n)]


def passk_closed(f, k: int) -> list[Fraction]:
    """PKPO binary effective rewards (spec 2.1): k/n if correct, else (k/n) rho(n-1, c, k-1)."""
    n, c = len(f), int(sum(1 for v in f if v))
    kn = Fraction(k, n)
    rho = 1 - Fraction(comb(n - 1 - c, k - 1), comb(n - 1, k - 1)) if k >= 2 else Fraction(0)
    return [kn if v else kn * rho for v in f]


def tang_loo(g) -> list[Fraction]:
    """Tang et al. (spec 5): max(g) - max of the others; n = 1: 0."""
    g = _fr(g)
    n = len(g)
    if n == 1:
        return [Fraction(0)]
    return [max(g) - max(g[j] for j in range(n) if j != i) for i in range(n)]


# --------------------------------------------------------------------------------------------
# Mean-scale (GRPO-style) estimators
# --------------------------------------------------------------------------------------------

def bon_max_mean(g) -> list[Fraction]:
    """(g_i - mean(g)) where g_i == max(g), else 0 (spec 3.3)."""
    g = _fr(g)
    top, mean = max(g), _avg(g)
    return [v - mean if v == top else Fraction(0) for v in g]


def bon_max_second(g) -> list[Fraction]:
    """(g_i - largest value strictly below the max) where g_i == max, else 0; all-equal: 0."""
    g = _fr(g)
    top = max(g)
    below = [v for v in g if v != top]
    if not below:
        return [Fraction(0)] * len(g)
    second = max(below)
    return [v - second if v == top else Fraction(0) for v in g]


def _zscore(x: list[Fraction], eps: float, *, ddof: int, guard: bool) -> list[float]:
    """(x - mean)/(std + eps), mean and variance exact, one float sqrt."""
    n = len(x)
    if n - ddof <= 0:
        return [0.0] * n
    mean = _avg(x)
    var = sum(((v - mean) ** 2 for v in x), Fraction(0)) / (n - ddof)
    std = math.sqrt(var)  # correctly rounded sqrt of the rounded variance
    if guard and std <= ZSCORE_CONSTANT_RTOL * float(max(abs(v) for v in x)):
        return [0.0] * n
    return [float(v - mean) / (std + eps) for v in x]


def bon_mean(g, k: int, eps: float) -> list[float]:
    """z-score of s_i with the sample std (n-1) and eps; 0 for a (numerically) constant s or n = 1."""
    return _zscore(enumerate_s(g, k), eps, ddof=1, guard=True)


def chen_passk(f, k: int, eps: float) -> list[float]:
    """Chen et al. (spec 6), directly: R = 1 - C(n_neg,k)/C(n,k), sigma = sqrt(R(1-R)),
    A_pos = (1-R)/(sigma+eps), A_neg = (1 - R - C(n_neg-1,k-1)/C(n-1,k-1))/(sigma+eps);
    0 where c = 0 or n - c < k (conventions.md)."""
    n = len(f)
    c = int(sum(1 for v in f if v))
    n_neg = n - c
    if c == 0 or n_neg < k:
        return [0.0] * n
    R = 1 - Fraction(comb(n_neg, k), comb(n, k))
    denom = math.sqrt(R * (1 - R)) + eps
    a_pos = float(1 - R) / denom
    a_neg = float(1 - R - Fraction(comb(n_neg - 1, k - 1), comb(n - 1, k - 1))) / denom
    return [a_pos if v else a_neg for v in f]


def _rlb_weights(n: int, c: int, k: int, positive_only: bool):
    """Chow's weights (spec 4 / conventions.md) with the plug-in failure rate p = (n-c)/n.
    Returns (w_plus, w_minus); w_minus may be +inf (every sample fails, p = 1)."""
    p = Fraction(n - c, n)
    if positive_only:  # k p^(k-1) / (1 + p + ... + p^(k-1)), the geometric sum in closed form
        geometric = Fraction(k) if p == 1 else (1 - p**k) / (1 - p)
        return k * p ** (k - 1) / geometric, Fraction(0)
    w_plus = k * p ** (k - 1) / (1 - p**k) if p != 1 else None  # unused when c = 0
    w_minus = k * p / (1 - p) if p != 1 else math.inf
    return w_plus, w_minus


def enumerate_bon_rlb(f, k: int, positive_only: bool) -> list:
    """BoN-RLB as conventions.md defines it: in every k-subset the BoN sample (its best sample,
    uniformly among tied ones) gets Chow's weight (g+ if correct, +g- if every sample of the subset
    failed; gbar+ / 0 for the positive-only variant); averaged over all k-subsets; natural scale
    (mean) = n times that."""
    n = len(f)
    c = int(sum(1 for v in f if v))
    w_plus, w_minus = _rlb_weights(n, c, k, positive_only)
    acc = [Fraction(0)] * n
    inf = [False] * n
    for I in combinations(range(n), k):
        winners = [i for i in I if f[i]] or list(I)  # the best samples of the subset (ties)
        if f[winners[0]]:
            for i in winners:
                acc[i] += w_plus / len(winners)
        elif w_minus == math.inf:
            for i in winners:
                inf[i] = True
        else:
            for i in winners:
                acc[i] += w_minus / len(winners)
    norm = Fraction(n, comb(n, k))
    return [math.inf if inf[i] else acc[i] * norm for i in range(n)]


def closed_bon_rlb(f, k: int, positive_only: bool) -> list:
    """conventions.md closed form (sum scale times n): correct w_plus R/c, wrong w_minus (1-R)/(n-c)."""
    n = len(f)
    c = int(sum(1 for v in f if v))
    R = pass_at_k(f, k)
    w_plus, w_minus = _rlb_weights(n, c, k, positive_only)
    correct = n * w_plus * R / c if c else None
    wrong = None
    if c < n:
        wrong = math.inf if w_minus == math.inf else n * w_minus * (1 - R) / (n - c)
    return [correct if v else wrong for v in f]


def grpo(g, eps: float) -> list[float]:
    """(g - mean)/(sample std + eps); n = 1: 0."""
    return _zscore(_fr(g), eps, ddof=1, guard=False)


def rloo(g) -> list[Fraction]:
    """g_i - mean of the others; n = 1: 0."""
    g = _fr(g)
    n = len(g)
    if n == 1:
        return [Fraction(0)]
    tot = sum(g, Fraction(0))
    return [v - (tot - v) / (n - 1) for v in g]


def dr_grpo(g) -> list[Fraction]:
    """g_i - group mean."""
    g = _fr(g)
    mean = _avg(g)
    return [v - mean for v in g]


def maxrl(g) -> list[Fraction]:
    """MaxRL (spec 12): (g_i - mean) / mean, 0 when the mean is 0 (a singleton: (g - g)/g = 0)."""
    g = _fr(g)
    mean = _avg(g)
    if mean == 0:
        return [Fraction(0)] * len(g)
    return [(v - mean) / mean for v in g]


# --------------------------------------------------------------------------------------------
# Dispatch and scale handling
# --------------------------------------------------------------------------------------------

def natural(name: str, g, k: int, *, deltas=None, clamp_delta=None, eps: float = 1e-6) -> list:
    """The estimator's values for one group, in its natural scale, by the defining formulas."""
    if name == "maxk":
        return enumerate_s(g, k)
    if name == "maxk_loo":
        return enumerate_loo_paper(g, k)
    if name == "maxk_loo_centered":
        return enumerate_loo_centered(g, k)
    if name == "maxk_loo1":
        return enumerate_loo1(g, k)
    if name == "maxk_offpolicy":
        return enumerate_offpolicy(g, k, deltas, clamp_delta)
    if name == "maxk_offpolicy_exact":
        return enumerate_offpolicy_exact(g, k, deltas, clamp_delta)
    if name == "passk":
        return passk_closed(g, k)
    if name == "tang_loo":
        return tang_loo(g)
    if name == "bon_max_mean":
        return bon_max_mean(g)
    if name == "bon_max_second":
        return bon_max_second(g)
    if name == "bon_mean":
        return bon_mean(g, k, eps)
    if name == "chen_passk":
        return chen_passk(g, k, eps)
    if name == "bon_rlb":
        return enumerate_bon_rlb(g, k, positive_only=False)
    if name == "bon_rlb_pos":
        return enumerate_bon_rlb(g, k, positive_only=True)
    if name == "grpo":
        return grpo(g, eps)
    if name == "rloo":
        return rloo(g)
    if name == "dr_grpo":
        return dr_grpo(g)
    if name == "maxrl":
        return maxrl(g)
    raise ValueError(f"oracle: unknown estimator {name!r}")


def to_scale(name: str, values, n: int, scale: str) -> list[float]:
    """Natural scale -> requested scale: 'mean' is exactly n times 'sum' (done exactly here)."""
    nat = NATURAL_SCALE[name]
    out = []
    for v in values:
        if isinstance(v, float) and math.isinf(v):
            out.append(v)
            continue
        v = Fraction(v) if not isinstance(v, Fraction) else v
        if nat == scale:
            out.append(float(v))
        elif scale == "mean":
            out.append(float(v * n))
        else:
            out.append(float(v / n))
    return out


def apply_clip(name: str, values, clip):
    if clip is None and name == "bon_rlb":
        clip = BON_RLB_DEFAULT_CLIP
    if clip is None:
        return list(values)
    lo, hi = clip
    return [min(max(v, lo), hi) for v in values]


def expected(name: str, g, k: int, scale: str, *, deltas=None, clamp_delta=None, clip=None,
             eps: float = 1e-6, closed: bool = False) -> list[float]:
    """What bk.advantages must return for one group: natural value -> scale -> clip."""
    fn = natural_closed if closed else natural
    vals = fn(name, g, k, deltas=deltas, clamp_delta=clamp_delta, eps=eps)
    return apply_clip(name, to_scale(name, vals, len(g), scale), clip)


# --------------------------------------------------------------------------------------------
# Closed forms (spec's sorted formulas, exact binomial tables, float64): for large n
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _binom_row_cached(n: int, k: int, shift: int) -> np.ndarray:
    """[C(j-1-shift, k-1-shift) / C(n,k) for j = 1..n] as float64, from exact big integers
    (Python's int / int is correctly rounded). shift 0, 1, 2 give the tables d, o, q of spec 0.1."""
    total = math.comb(n, k)
    a, b = -1 - shift, k - 1 - shift  # C(j-1-shift, b) for j = 1..n
    out = np.zeros(n)
    if b < 0:
        return out
    cur = None
    for j in range(1, n + 1):
        top = j + a
        if top < b:
            continue
        # C(top, b) from C(top-1, b) = C(top-1,b) * top / (top-b), exact in integers
        cur = 1 if top == b else cur * top // (top - b)
        out[j - 1] = cur / total
    out.flags.writeable = False
    return out


def binom_row(n: int, k: int, shift: int) -> np.ndarray:
    """[C(j-1-shift, k-1-shift) / C(n,k) for j = 1..n] as float64, from exact big integers
    (Python's int / int is correctly rounded). shift 0, 1, 2 give the tables d, o, q of spec 0.1."""
    return _binom_row_cached(n, k, shift).copy()


def _sorted(g):
    g = np.asarray(g, dtype=np.float64)
    perm = np.argsort(g, kind="stable")
    return g, perm, g[perm]


def _scatter(perm, vals_sorted):
    out = np.empty_like(vals_sorted)
    out[perm] = vals_sorted
    return out


def _suffix_excl(x):
    """sum_{t > i} x_t."""
    c = np.cumsum(x[::-1])[::-1]
    return np.concatenate([c[1:], [0.0]])


def _prefix_excl(x):
    """sum_{t < i} x_t."""
    return np.concatenate([[0.0], np.cumsum(x)[:-1]])


def closed_s(g, k):
    """s_(i) = d_i g_(i) + sum_{j>i} o_j g_(j) (spec 2.2)."""
    g, perm, x = _sorted(g)
    n = len(x)
    d, o = binom_row(n, k, 0), binom_row(n, k, 1)
    return _scatter(perm, d * x + _suffix_excl(o * x))


def closed_maxk_rest(g, k):
    """max@k of g without sorted sample i, for every i (spec 2.3 scans with w' = d(n-1, k))."""
    g, perm, x = _sorted(g)
    n = len(x)
    w = binom_row(n - 1, k, 0)
    pre = _prefix_excl(w * x[:-1])  # sum_{t<i} w'_t x_t, i = 0..n-1 (0-based)
    pre = np.concatenate([pre, [pre[-1] + w[-1] * x[-2]]]) if n >= 2 else pre
    suf = np.concatenate([np.cumsum((w * x[1:])[::-1])[::-1], [0.0]])  # sum_{t>=i} w'_t x_{t+1}
    return _scatter(perm, pre[:n] + suf)


def closed_loo1(g, k):
    """d_i y_i - sum_{t<i} o_{t+1} y_t with y = g - min (spec 2.4); k = 1: RLOO/n."""
    g, perm, x = _sorted(g)
    n = len(x)
    if k == 1:
        return (g - (g.sum() - g) / (n - 1)) / n if n > 1 else np.zeros(1)
    y = x - x[0]
    d, o = binom_row(n, k, 0), binom_row(n, k, 1)
    o_next = np.concatenate([o[1:], [0.0]])  # o_{t+1} at position t
    return _scatter(perm, d * y - _prefix_excl(o_next * y))


def closed_offpolicy(g, k, deltas, clamp_delta=None):
    """Spec 3.2 O(n) form: (1+dl_i)[d_i g_i + S1_i] + o_i D_i g_i + S2_i + S3_i - dl_i S4_i."""
    g, perm, x = _sorted(g)
    dl = np.asarray(deltas, dtype=np.float64)
    if clamp_delta is not None:
        dl = np.clip(dl, -clamp_delta, clamp_delta)
    dl = dl[perm]
    n = len(x)
    d, o, q = (binom_row(n, k, s) for s in (0, 1, 2))
    D = _prefix_excl(dl)
    S1, S2 = _suffix_excl(o * x), _suffix_excl(o * dl * x)
    S3, S4 = _suffix_excl(q * D * x), _suffix_excl(q * x)
    return _scatter(perm, (1 + dl) * (d * x + S1) + o * D * x + S2 + S3 - dl * S4)


def closed_offpolicy_exact(g, k, deltas, clamp_delta=None):
    """Spec 3.4 by a second route: A_i = rho_i dJ/drho_i for the importance-weighted objective
    J(rho) = (1/C(n,k)) sum_{|I|=k} prod_{l in I} rho_l max_I g, with J evaluated in sorted order
    as (1/C(n,k)) sum_j rho_j g_(j) e_{k-1}(rho of the samples ranked below j) (one DP over j)
    and differentiated by torch autograd in float64. O(n k); no alternating sums (for rho >= 0
    every term is >= 0 when g >= 0)."""
    import torch

    g, perm, x = _sorted(g)
    dl = np.asarray(deltas, dtype=np.float64)
    if clamp_delta is not None:
        dl = np.clip(dl, -clamp_delta, clamp_delta)
    rho = torch.tensor(1.0 + dl[perm], dtype=torch.float64, requires_grad=True)
    xs = torch.tensor(x, dtype=torch.float64)
    e = torch.zeros(k, dtype=torch.float64)  # e_m of the ratios ranked below j, m = 0..k-1
    e[0] = 1.0
    J = torch.zeros((), dtype=torch.float64)
    for j in range(len(x)):
        J = J + rho[j] * xs[j] * e[k - 1]
        e = e + rho[j] * torch.cat([e.new_zeros(1), e[:-1]])
    (grad,) = torch.autograd.grad(J / float(math.comb(len(x), k)), rho)
    return _scatter(perm, (rho * grad).detach().numpy())


def _to_np(vals):
    return np.array([float(v) for v in vals])


def natural_closed(name: str, g, k: int, *, deltas=None, clamp_delta=None, eps=1e-6) -> np.ndarray:
    """Like :func:`natural`, through the closed forms (O(n) after the sort; for large n)."""
    g = np.asarray(g, dtype=np.float64)
    n = len(g)
    if name == "maxk":
        return closed_s(g, k)
    if name in ("maxk_loo", "maxk_loo_centered"):
        c = k / (n - 1) if name == "maxk_loo" else k / n
        return closed_s(g, k) - c * closed_maxk_rest(g, k)
    if name == "maxk_loo1":
        return closed_loo1(g, k)
    if name == "maxk_offpolicy":
        return closed_offpolicy(g, k, deltas, clamp_delta)
    if name == "maxk_offpolicy_exact":
        return closed_offpolicy_exact(g, k, deltas, clamp_delta)
    if name == "passk":
        return _to_np(passk_closed(g, k))
    if name == "tang_loo":
        out = np.zeros(n)
        if n > 1:
            i = int(np.argmax(g))
            out[i] = g[i] - np.max(np.delete(g, i))
        return out
    if name in ("bon_max_mean", "bon_max_second", "rloo", "dr_grpo", "maxrl"):
        return _to_np(natural(name, g, k))  # O(n) already
    if name == "bon_mean":
        return np.array(_zscore(_fr(closed_s(g, k)), eps, ddof=1, guard=True))
    if name == "chen_passk":
        return np.array(chen_passk(g, k, eps))
    if name in ("bon_rlb", "bon_rlb_pos"):
        return np.array([float(v) for v in closed_bon_rlb(g, k, name == "bon_rlb_pos")])
    if name == "grpo":
        return np.array(grpo(g, eps))
    raise ValueError(f"oracle: no closed form for {name!r}")


# --------------------------------------------------------------------------------------------
# A tiny softmax policy over a few outcomes (spec 10 Parts B and C): exact expectations
# --------------------------------------------------------------------------------------------

def policy(theta):
    """softmax(theta)."""
    theta = np.asarray(theta, dtype=np.float64)
    e = np.exp(theta - theta.max())
    return e / e.sum()


def expected_max(theta, rewards, k):
    """E[max of k i.i.d. draws] = sum_v v (F(v)^k - F(v-)^k) over the distinct reward values."""
    pi = policy(theta)
    r = np.asarray(rewards)
    total, below = 0.0, 0.0
    for v in sorted(set(rewards)):
        F = below + pi[r == v].sum()
        total += v * (F**k - below**k)
        below = F
    return total


def grad_expected_max(theta, rewards, k):
    """Closed-form gradient of expected_max: dF(v)/dtheta_j = sum_{r_x <= v} pi_x (1[x=j] - pi_j)."""
    pi = policy(theta)
    r = np.asarray(rewards)
    jac = np.diag(pi) - np.outer(pi, pi)  # d pi_x / d theta_j
    grad = np.zeros_like(theta)
    F_prev, dF_prev = 0.0, np.zeros_like(theta)
    for v in sorted(set(rewards)):
        mask = r == v
        F = F_prev + pi[mask].sum()
        dF = dF_prev + jac[mask].sum(axis=0)
        grad += v * k * (F ** (k - 1) * dF - F_prev ** (k - 1) * dF_prev)
        F_prev, dF_prev = F, dF
    return grad


def multisets(n, theta):
    """All multisets of n draws (as sorted outcome tuples) and their multinomial probabilities."""
    pi = policy(theta)
    draws, probs = [], []
    for ms in itertools.combinations_with_replacement(range(len(pi)), n):
        counts = np.bincount(ms, minlength=len(pi))
        coef = math.factorial(n) / math.prod(math.factorial(c) for c in counts)
        draws.append(ms)
        probs.append(coef * float(np.prod(pi**counts)))
    return np.array(draws), np.array(probs)
