"""Every estimator against the brute-force oracle (all k-subsets), n = 1..8, every valid k.

Fresh random rewards on every run; the seed is in every failure message (replay it with
BONKERNELS_TEST_SEED=<seed>). Backends under test: BONKERNELS_ORACLE_BACKENDS (comma separated,
e.g. "torch,cpu,triton,cuda"; triton on CPU needs TRITON_INTERPRET=1); default: the reference
("torch") plus the native CPU kernels when they are built.
"""

import math
import os
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

import bonkernels as bk
from bonkernels import estimators as registry

try:
    from . import oracle
except ImportError:
    import oracle

SEED = oracle.fresh_seed()


def _default_backends():
    """The reference, plus the native CPU kernels when they are built."""
    try:
        bk.advantages(torch.zeros(1, 2, dtype=torch.float64), 1, "maxk", backend="cpu")
        return ["torch", "cpu"]
    except Exception:  # not built: the API raises a clear error, tested elsewhere
        return ["torch"]


BACKENDS = (os.environ["BONKERNELS_ORACLE_BACKENDS"].split(",")
            if os.environ.get("BONKERNELS_ORACLE_BACKENDS") else _default_backends())


def _backend_implements(name, backend):
    """False only for an estimator the backend reports as unknown (a registry entry newer than it)."""
    dev = device_for(backend)
    try:
        bk.advantages(torch.ones(1, 2, dtype=torch.float64, device=dev), 1, name, backend=backend,
                      deltas=torch.zeros(1, 2, dtype=torch.float64, device=dev) if name in oracle.OFF_POLICY else None)
    except ValueError as error:
        return "unknown estimator code" not in str(error)
    return True


def device_for(backend):
    if backend in ("cuda", "triton") and torch.cuda.is_available():
        return "cuda"
    return "cpu"  # triton on CPU tensors needs TRITON_INTERPRET=1
N_MAX = 8
REAL_KINDS = ("gaussian", "binary", "tied", "equal", "toptie")
BINARY_KINDS = ("bernoulli", "all0", "all1", "one_correct", "one_wrong")
DYADIC_CONSTANTS = (0.0, 0.75, -2.5, 3.0, 1.0)  # exactly representable means: no 1/eps noise


def make_rewards(rng: random.Random, kind: str, n: int) -> list[float]:
    if kind == "gaussian":
        return [rng.gauss(0.0, 1.0) for _ in range(n)]
    if kind in ("binary", "bernoulli"):
        p = rng.random()
        return [float(rng.random() < p) for _ in range(n)]
    if kind == "tied":
        return [rng.choice((0.0, 0.25, 0.5, 1.0)) for _ in range(n)]
    if kind == "equal":
        return [rng.choice(DYADIC_CONSTANTS)] * n
    if kind == "toptie":
        g = [rng.gauss(0.0, 1.0) for _ in range(n)]
        if n >= 2:
            top = max(g)
            for i in rng.sample(range(n), rng.randint(2, n)):
                g[i] = top
        return g
    if kind == "all0":
        return [0.0] * n
    if kind == "all1":
        return [1.0] * n
    if kind in ("one_correct", "one_wrong"):
        hit = 1.0 if kind == "one_correct" else 0.0
        g = [1.0 - hit] * n
        g[rng.randrange(n)] = hit
        return g
    raise ValueError(kind)


def make_deltas(rng: random.Random, g: list[float]) -> list[float]:
    d = [rng.uniform(-0.6, 0.8) for _ in g]
    if len(g) >= 2 and rng.random() < 0.3:
        d[1] = d[0]  # sometimes equal deltas too
    return d


def zscore_noise(name, g, k, scale, eps):
    """Absolute error intrinsic to z-scoring in floating point: the rounding of x - mean (a few
    ulps of max|x|) divided by (std + eps); it only matters for (near-)constant groups, where the
    unguarded grpo turns ulps into ~1e-10 (spec 3.3 hazard)."""
    if name not in ("grpo", "bon_mean") or len(g) < 2:
        return 0.0
    x = np.array(g) if name == "grpo" else np.array([float(v) for v in oracle.enumerate_s(g, k)])
    noise = 16 * 2.0**-53 * np.max(np.abs(x)) / (np.std(x, ddof=1) + eps)
    return noise / (len(g) if scale == "sum" else 1)


def assert_group_close(got, exp, g, scale, deltas, context, extra_atol=0.0):
    """Tolerance 1e-12 relative to the group's scale (its outputs and its rewards)."""
    got = np.asarray(got, dtype=np.float64)
    exp = np.asarray(exp, dtype=np.float64)
    n = len(g)
    reward_scale = max(abs(v) for v in g) * (n if scale == "mean" else 1)
    if deltas is not None:
        reward_scale *= 1 + sum(abs(d) for d in deltas)
    finite = exp[np.isfinite(exp)]
    ref = (np.max(np.abs(finite)) if finite.size else 0.0) + reward_scale
    tol = 1e-12 * ref + extra_atol + 1e-300
    ok = np.allclose(got, exp, rtol=1e-12, atol=tol, equal_nan=False)
    assert ok, (f"seed={SEED} {context}\n rewards={g}\n deltas={deltas}\n got     ={got.tolist()}\n"
                f" expected={exp.tolist()}\n max abs err={np.max(np.abs(got - exp))} tol={tol}")


def k_values(name):
    if name in oracle.K_IGNORED:
        return (None,)  # one random k per call, possibly > n (no k check)
    return tuple(range(1, N_MAX + 1))


def build_groups(rng, name, k):
    kinds = BINARY_KINDS if name in oracle.BINARY_ONLY else REAL_KINDS
    margin = 1 if name in oracle.LOO_NEEDS_REST else 0
    n_min = 1 if k is None else k + margin
    groups = []
    for n in range(n_min, N_MAX + 1):
        for kind in kinds:
            for _ in range(2 if kind in ("gaussian", "bernoulli") else 1):
                g = make_rewards(rng, kind, n)
                if name in oracle.NON_NEGATIVE:
                    g = [abs(v) for v in g]
                deltas = make_deltas(rng, g) if name in oracle.OFF_POLICY else None
                groups.append((kind, g, deltas))
    return groups


def call_packed(groups, k, name, backend, **kw):
    flat = [v for _, g, _ in groups for v in g]
    offsets = np.cumsum([0] + [len(g) for _, g, _ in groups])
    dev = device_for(backend)
    rewards = torch.tensor(flat, dtype=torch.float64, device=dev)
    deltas = None
    if groups[0][2] is not None:
        deltas = torch.tensor([v for _, _, d in groups for v in d], dtype=torch.float64, device=dev)
    out = bk.advantages(rewards, k, name, deltas=deltas, backend=backend,
                        offsets=torch.tensor(offsets, dtype=torch.int64, device=dev), **kw)
    assert out.dtype == torch.float64 and out.shape == rewards.shape
    out = out.cpu()
    return [out[offsets[i]:offsets[i + 1]].tolist() for i in range(len(groups))]


def test_natural_scales_match_registry():
    assert set(bk.ESTIMATORS) == set(oracle.ALL_ESTIMATORS)
    for name in oracle.ALL_ESTIMATORS:
        e = registry.get(name)
        assert e.scale == oracle.NATURAL_SCALE[name], name
        assert e.uses_k == (name not in oracle.K_IGNORED), name
        assert e.binary == (name in oracle.BINARY_ONLY), name
        assert e.needs_deltas == (name in oracle.OFF_POLICY), name
        assert e.k_margin == (1 if name in oracle.LOO_NEEDS_REST else 0), name
    assert tuple(registry.BON_RLB_DEFAULT_CLIP) == oracle.BON_RLB_DEFAULT_CLIP  # conventions.md
    assert registry.ZSCORE_CONSTANT_RTOL == oracle.ZSCORE_CONSTANT_RTOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_matches_enumeration(name, backend):
    if name == "maxk_offpolicy_exact" and backend not in ("torch", "auto"):
        pytest.skip("maxk_offpolicy_exact is reference-only (conventions.md)")
    if not _backend_implements(name, backend):
        pytest.skip(f"{backend} does not implement {name} yet (maxrl lands with the kernel branches)")
    rng = random.Random(f"{SEED}-{name}")
    for k in k_values(name):
        groups = build_groups(rng, name, k)
        if not groups:
            continue
        call_k = rng.randint(1, N_MAX + 3) if k is None else k
        clamp = 0.3 if name in oracle.OFF_POLICY else None
        eps = 1e-6
        # (scale, clamp_delta, clip, eps) variants, each one batched call over all the groups
        variants = [("sum", None, None, eps), ("mean", None, None, eps),
                    ("mean", clamp, (-0.4, 0.3), 1e-4), ("sum", clamp, (-0.05, 0.07), 1e-4)]
        if name == "bon_rlb":
            variants.append(("mean", None, (-1e9, 1e9), eps))  # the unclipped weights (inf: 1e9)
        for scale, clamp_delta, clip, e in variants:
            kw = dict(scale=scale, clip=clip, eps=e)
            if clamp_delta is not None:
                kw["clamp_delta"] = clamp_delta
            got = call_packed(groups, call_k, name, backend, **kw)
            for (kind, g, deltas), got_g in zip(groups, got):
                exp = oracle.expected(name, g, call_k, scale, deltas=deltas,
                                      clamp_delta=clamp_delta, clip=clip, eps=e)
                ctx = (f"estimator={name} backend={backend} n={len(g)} k={call_k} kind={kind} "
                       f"scale={scale} clamp_delta={clamp_delta} clip={clip} eps={e}")
                assert_group_close(got_g, exp, g, scale, deltas, ctx,
                                   zscore_noise(name, g, call_k, scale, e))


@pytest.mark.parametrize("name", ["maxk", "maxk_loo1", "chen_passk", "grpo"])
def test_two_dimensional_layout_matches_enumeration(name):
    """The [G, n] layout (full rows) gives the same per-group values."""
    rng = random.Random(f"{SEED}-2d-{name}")
    n, k = 6, 3
    kind = "bernoulli" if name in oracle.BINARY_ONLY else "gaussian"
    rows = [make_rewards(rng, kind, n) for _ in range(5)]
    out = bk.advantages(torch.tensor(rows, dtype=torch.float64), k, name, backend="torch",
                        scale="sum")
    for g, got in zip(rows, out.tolist()):
        assert_group_close(got, oracle.expected(name, g, k, "sum"), g, "sum", None,
                           f"estimator={name} 2-D n={n} k={k}")


def test_metrics_match_enumeration():
    rng = random.Random(f"{SEED}-metrics")
    for k in range(1, N_MAX + 1):
        groups = [make_rewards(rng, kind, n) for n in range(k, N_MAX + 1) for kind in REAL_KINDS]
        offsets = torch.tensor(np.cumsum([0] + [len(g) for g in groups]), dtype=torch.int64)
        flat = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
        got = bk.max_at_k(flat, k, offsets=offsets).tolist()
        for g, m in zip(groups, got):
            exp = float(oracle.max_at_k(g, k))
            assert abs(m - exp) <= 1e-12 * (1 + max(abs(v) for v in g)), (SEED, g, k, m, exp)
        binary = [make_rewards(rng, kind, n) for n in range(k, N_MAX + 1) for kind in BINARY_KINDS]
        offsets = torch.tensor(np.cumsum([0] + [len(f) for f in binary]), dtype=torch.int64)
        flat = torch.tensor([v for f in binary for v in f], dtype=torch.float64)
        for correct in (flat, flat.bool(), flat.long()):
            got = bk.pass_at_k(correct, k, offsets=offsets)
            assert got.dtype == torch.float64
            for f, p in zip(binary, got.tolist()):
                exp = float(oracle.pass_at_k(f, k))
                assert abs(p - exp) <= 1e-13, (SEED, f, k, p, exp)


# ---------------------------------------------------------------------------------------------
# The oracle against the spec's own identities (spec 10 Part A), so that the oracle itself is
# checked by a second route, not only trusted.
# ---------------------------------------------------------------------------------------------

def _sorted_matrix_apply(g, weight):
    """(1/C(n,k)) sum_{j >= i} W[i, j] g_(j) in sorted order, scattered back (Bagirov's matrix)."""
    perm = sorted(range(len(g)), key=lambda i: g[i])
    x = [g[p] for p in perm]
    n = len(x)
    out = [0.0] * n
    for a in range(n):  # 0-based sorted position; 1-based rank a + 1
        out[perm[a]] = sum(weight(a + 1, b + 1, perm) * x[b] for b in range(a, n))
    return out


def _oracle_cases(rng, n_max=7, kinds=REAL_KINDS):
    for n in range(1, n_max + 1):
        for kind in kinds:
            yield kind, make_rewards(rng, kind, n)


def test_oracle_s_equals_bagirov_matrix_and_closed_form():
    rng = random.Random(f"{SEED}-self-s")
    C = oracle.comb
    for kind, g in _oracle_cases(rng):
        n = len(g)
        for k in range(1, n + 1):
            s = [float(v) for v in oracle.enumerate_s(g, k)]
            w = lambda i, j, _p: (C(i - 1, k - 1) if i == j else C(j - 2, k - 2)) / C(n, k)
            np.testing.assert_allclose(s, _sorted_matrix_apply(g, w), rtol=0, atol=1e-13)
            np.testing.assert_allclose(s, oracle.closed_s(g, k), rtol=0, atol=1e-13)
            m = float(oracle.max_at_k(g, k))
            assert math.isclose(sum(s), k * m, abs_tol=1e-13)
            d = oracle.binom_row(n, k, 0)
            assert math.isclose(m, float(np.dot(d, sorted(g))), abs_tol=1e-13)
            assert math.isclose(d.sum(), 1.0, abs_tol=1e-15) and math.isclose(d[-1], k / n)


def test_oracle_pass_at_k_forms_and_binary_rewards():
    rng = random.Random(f"{SEED}-self-pass")
    for kind, f in _oracle_cases(rng, 8, BINARY_KINDS):
        n = len(f)
        for k in range(1, n + 1):
            exact = oracle.pass_at_k(f, k)
            subset = float(oracle.max_at_k(f, k))  # average of 1 - prod(1 - f) = max f
            assert math.isclose(float(exact), subset, abs_tol=1e-15)
            assert math.isclose(float(exact), oracle.pass_at_k_product(f, k), abs_tol=1e-15)
            assert oracle.passk_closed(f, k) == oracle.enumerate_s(f, k)  # spec 2.1 == 2.2, exactly


def test_oracle_leave_one_out_forms():
    rng = random.Random(f"{SEED}-self-loo")
    for kind, g in _oracle_cases(rng):
        n = len(g)
        for k in range(1, n):
            s = oracle.enumerate_s(g, k)
            rest = [float(oracle.max_at_k(g[:i] + g[i + 1:], k)) for i in range(n)]
            paper = [float(v) for v in oracle.enumerate_loo_paper(g, k)]
            np.testing.assert_allclose(paper, [float(s[i]) - k / (n - 1) * rest[i] for i in range(n)],
                                       rtol=0, atol=1e-13)
            np.testing.assert_allclose(paper, oracle.natural_closed("maxk_loo", g, k), atol=1e-13)
            cent = [float(v) for v in oracle.enumerate_loo_centered(g, k)]
            np.testing.assert_allclose(cent, oracle.natural_closed("maxk_loo_centered", g, k),
                                       rtol=0, atol=1e-13)
            if k == 1:  # spec 8: paper g_i/n - mean_{-i}/(n-1); centered RLOO/n
                mo = [(sum(g) - g[i]) / (n - 1) for i in range(n)]
                np.testing.assert_allclose(paper, [g[i] / n - mo[i] / (n - 1) for i in range(n)],
                                           atol=1e-13)
                np.testing.assert_allclose(cent, [(g[i] - mo[i]) / n for i in range(n)], atol=1e-13)


def test_oracle_loo1_forms():
    rng = random.Random(f"{SEED}-self-loo1")
    for kind, g in _oracle_cases(rng):
        n = len(g)
        for k in range(2, n + 1):
            sub = [float(v) for v in oracle.enumerate_loo1(g, k)]
            np.testing.assert_allclose(sub, oracle.closed_loo1(g, k), rtol=0, atol=1e-13)
            # PKPO Eq. 34: s_i - (k/n) max@(k-1) of the others
            s = oracle.enumerate_s(g, k)
            eq34 = [float(s[i]) - k / n * float(oracle.max_at_k(g[:i] + g[i + 1:], k - 1))
                    for i in range(n)]
            np.testing.assert_allclose(sub, eq34, rtol=0, atol=1e-13)
            assert min(sub) >= -1e-15 and sub[g.index(min(g))] == 0.0
            if k == n:
                np.testing.assert_allclose(sub, [float(v) for v in oracle.tang_loo(g)], atol=1e-13)


def test_oracle_offpolicy_forms():
    rng = random.Random(f"{SEED}-self-off")
    C = oracle.comb
    for kind, g in _oracle_cases(rng):
        n = len(g)
        dl = make_deltas(rng, g)
        for k in range(1, n + 1):
            first = [float(v) for v in oracle.enumerate_offpolicy(g, k, dl)]

            def w(i, j, perm):  # spec 3.2 w'_ij, sorted 1-based ranks, deltas sorted too
                ds = [dl[p] for p in perm]
                below = sum(ds[:j - 1])
                if i == j:
                    v = C(i - 1, k - 1) * (1 + ds[i - 1]) + C(i - 2, k - 2) * below
                else:
                    v = (C(j - 2, k - 2) * (1 + ds[i - 1] + ds[j - 1])
                         + C(j - 3, k - 3) * (below - ds[i - 1]))
                return v / C(n, k)

            np.testing.assert_allclose(first, _sorted_matrix_apply(g, w), rtol=0, atol=1e-12)
            np.testing.assert_allclose(first, oracle.closed_offpolicy(g, k, dl), rtol=0, atol=1e-12)
            zero = [0.0] * n
            s = oracle.enumerate_s(g, k)
            assert oracle.enumerate_offpolicy(g, k, zero) == s
            assert oracle.enumerate_offpolicy_exact(g, k, zero) == s
            if k == 1:
                exact = [float(v) for v in oracle.enumerate_offpolicy_exact(g, k, dl)]
                np.testing.assert_allclose(first, [(1 + d) * v / n for d, v in zip(dl, g)], atol=1e-13)
                np.testing.assert_allclose(exact, first, rtol=0, atol=1e-13)


def test_oracle_chen_and_bon_rlb_forms():
    rng = random.Random(f"{SEED}-self-bin")
    eps = 1e-6
    for kind, f in _oracle_cases(rng, 8, BINARY_KINDS):
        n, c = len(f), int(sum(f))
        for k in range(1, n + 1):
            chen = oracle.chen_passk(f, k, eps)
            R = oracle.pass_at_k(f, k)
            if c == 0 or n - c < k:
                assert chen == [0.0] * n
            else:  # conventions.md form: ((n/k) s - R)/(sqrt(R(1-R)) + eps); exactly centered
                s = oracle.enumerate_s(f, k)
                alt = [float(Fraction(n, k) * v - R) / (math.sqrt(R * (1 - R)) + eps)
                       for v in s]
                np.testing.assert_allclose(chen, alt, rtol=1e-14, atol=1e-14)
                assert abs(sum(chen)) < 1e-12
            if k == 1 and 0 < c < n:  # spec 6: k = 1 is the GRPO z-score with the population std
                mean = c / n
                std = math.sqrt(mean * (1 - mean))
                np.testing.assert_allclose(chen, [(v - mean) / (std + eps) for v in f], rtol=1e-13)
            for pos in (False, True):
                en = oracle.enumerate_bon_rlb(f, k, pos)
                cl = oracle.closed_bon_rlb(f, k, pos)
                assert [float(v) for v in en] == [float(v) for v in cl], (f, k, pos)
            w_plus, _ = oracle._rlb_weights(n, c, k, positive_only=True)
            assert 0 <= w_plus <= 1  # gbar+ in [0, 1]


@pytest.mark.parametrize("name", ["maxk_loo1", "maxk_offpolicy", "bon_rlb", "bon_mean"])
def test_group_ids_and_padded_layouts_match_enumeration(name):
    """Scattered group ids (in any order) and a padded [G, n_max] + lengths layout."""
    rng = random.Random(f"{SEED}-layouts-{name}")
    k = 2
    kinds = BINARY_KINDS if name in oracle.BINARY_ONLY else REAL_KINDS
    groups = [make_rewards(rng, rng.choice(kinds), rng.randint(k, N_MAX)) for _ in range(7)]
    deltas = [make_deltas(rng, g) for g in groups] if name in oracle.OFF_POLICY else None
    want = [oracle.expected(name, g, k, "sum", deltas=None if deltas is None else deltas[i])
            for i, g in enumerate(groups)]
    # group ids: arbitrary integers, samples interleaved at random
    ids = rng.sample(range(-50, 50), len(groups))
    slots = [(gi, j) for gi, g in enumerate(groups) for j in range(len(g))]
    rng.shuffle(slots)
    r = torch.tensor([groups[gi][j] for gi, j in slots], dtype=torch.float64)
    gid = torch.tensor([ids[gi] for gi, _ in slots], dtype=torch.int64)
    kw = {}
    if deltas is not None:
        kw["deltas"] = torch.tensor([deltas[gi][j] for gi, j in slots], dtype=torch.float64)
    out = bk.advantages(r, k, name, group_ids=gid, scale="sum", backend="torch", **kw).tolist()
    for (gi, j), a in zip(slots, out):
        g = groups[gi]
        assert abs(a - want[gi][j]) <= 1e-12 * (1 + max(abs(v) for v in g) + max(map(abs, want[gi]))), (
            SEED, name, g, j, a, want[gi][j])
    # padded: garbage in the tail must not matter, and the tail comes back 0
    n_max = max(len(g) for g in groups)
    pad = torch.full((len(groups), n_max), 123.0, dtype=torch.float64)
    dpad = torch.full_like(pad, 0.5)
    for gi, g in enumerate(groups):
        pad[gi, :len(g)] = torch.tensor(g, dtype=torch.float64)
        if deltas is not None:
            dpad[gi, :len(g)] = torch.tensor(deltas[gi], dtype=torch.float64)
    kw = {"deltas": dpad} if deltas is not None else {}
    lengths = torch.tensor([len(g) for g in groups])
    out = bk.advantages(pad, k, name, lengths=lengths, scale="sum", backend="torch", **kw)
    for gi, g in enumerate(groups):
        assert_group_close(out[gi, :len(g)].tolist(), want[gi], g, "sum",
                           None if deltas is None else deltas[gi], f"padded {name}")
        assert torch.all(out[gi, len(g):] == 0)
