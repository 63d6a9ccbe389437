"""Structural properties of every estimator (spec 0, 8, 10 Part A/D), through the public API:
permutation and tie invariance, the k = 1 / k = n reductions, the identities between estimators,
the scale rule, constant rewards, and large groups (n = 4096) in float64 and float32 against the
oracle's closed forms (exact big-integer binomial tables).
"""

import random

import numpy as np
import pytest
import torch

import bonkernels as bk

try:
    from . import oracle
    from .test_enumeration import BINARY_KINDS, REAL_KINDS, make_deltas, make_rewards, zscore_noise
except ImportError:
    import oracle
    from test_enumeration import BINARY_KINDS, REAL_KINDS, make_deltas, make_rewards, zscore_noise

SEED = oracle.fresh_seed()
F64 = torch.float64


def adv(rewards, k, name, **kw):
    kw.setdefault("backend", "torch")
    return bk.advantages(rewards, k, name, **kw)


def random_batch(rng, name, n_values, k):
    """Packed groups for `name` (valid for k), with deltas when it needs them."""
    kinds = BINARY_KINDS if name in oracle.BINARY_ONLY else REAL_KINDS
    margin = 1 if name in oracle.LOO_NEEDS_REST else 0
    groups = []
    for n in n_values:
        if name not in oracle.K_IGNORED and n < k + margin:
            continue
        for kind in kinds:
            g = make_rewards(rng, kind, n)
            groups.append([abs(v) for v in g] if name in oracle.NON_NEGATIVE else g)
    deltas = [make_deltas(rng, g) for g in groups] if name in oracle.OFF_POLICY else None
    return groups, deltas


def pack(groups, deltas=None, dtype=F64):
    offsets = torch.tensor(np.cumsum([0] + [len(g) for g in groups]), dtype=torch.int64)
    r = torch.tensor([v for g in groups for v in g], dtype=dtype)
    d = None if deltas is None else torch.tensor([v for dg in deltas for v in dg], dtype=dtype)
    return r, offsets, d


def scale_of(groups):
    return max(1.0, max(abs(v) for g in groups for v in g))


# --------------------------------------------------------------------------------------------
# Permutation and tie invariance
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_permutation_invariance(name):
    rng = random.Random(f"{SEED}-perm-{name}")
    for k in (1, 2, 3):
        groups, deltas = random_batch(rng, name, range(1, 9), k)
        perms = [rng.sample(range(len(g)), len(g)) for g in groups]
        shuffled = [[g[p] for p in pm] for g, pm in zip(groups, perms)]
        sh_deltas = None if deltas is None else [[d[p] for p in pm] for d, pm in zip(deltas, perms)]
        r, off, d = pack(groups, deltas)
        rs, _, ds = pack(shuffled, sh_deltas)
        out = adv(r, k, name, offsets=off, deltas=d, scale="sum")
        out_s = adv(rs, k, name, offsets=off, deltas=ds, scale="sum")
        follow = torch.cat([out[off[i]:off[i + 1]][torch.tensor(pm, dtype=torch.long)]
                            for i, pm in enumerate(perms)])
        tol = 1e-13 * scale_of(groups) * (3 if deltas is not None else 1)
        tol += max(zscore_noise(name, g, k, "sum", 1e-6) for g in groups)  # summation order
        assert torch.allclose(out_s, follow, rtol=1e-13, atol=tol), (SEED, name, k)


@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_tied_samples_get_equal_advantages(name):
    rng = random.Random(f"{SEED}-ties-{name}")
    for k in (1, 2, 3, 4):
        groups, deltas = random_batch(rng, name, range(2, 9), k)
        if deltas is not None:  # tied rewards get equal deltas too (spec 0: equal up to deltas)
            for g, dg in zip(groups, deltas):
                first = {}
                for i, v in enumerate(g):
                    dg[i] = first.setdefault(v, dg[i])
        r, off, d = pack(groups, deltas)
        out = adv(r, k, name, offsets=off, deltas=d, scale="sum").tolist()
        tol = 1e-13 * scale_of(groups) * (3 if deltas is not None else 1)
        for i, g in enumerate(groups):
            a = out[off[i]:off[i + 1]]
            for x in range(len(g)):
                for y in range(x):
                    if g[x] == g[y]:
                        assert abs(a[x] - a[y]) <= tol, (SEED, name, k, g, a)


# --------------------------------------------------------------------------------------------
# k = 1 and k = n reductions (spec 8), and identities between estimators
# --------------------------------------------------------------------------------------------

def _rows(rng, kind, n, count=6):
    return torch.tensor([make_rewards(rng, kind, n) for _ in range(count)], dtype=F64)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_k_equal_1_reductions(n):
    rng = random.Random(f"{SEED}-k1-{n}")
    g = _rows(rng, "gaussian", n)
    f = _rows(rng, "bernoulli", n)
    mean_others = (g.sum(1, keepdim=True) - g) / (n - 1)
    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)
    close(adv(g, 1, "maxk", scale="sum"), g / n)
    close(adv(g, 1, "maxk_loo", scale="sum"), g / n - mean_others / (n - 1))
    close(adv(g, 1, "maxk_loo_centered", scale="sum"), (g - mean_others) / n)
    close(adv(g, 1, "maxk_loo1", scale="sum"), (g - mean_others) / n)
    close(adv(g, 1, "rloo", scale="sum"), (g - mean_others) / n)
    dl = torch.rand_like(g) - 0.5
    for name in ("maxk_offpolicy", "maxk_offpolicy_exact"):
        close(adv(g, 1, name, deltas=dl, scale="sum"), (1 + dl) * g / n)
    close(adv(f, 1, "passk", scale="sum"), f / n)
    close(adv(f, 1, "bon_rlb_pos", scale="sum"), f / n)  # gbar+_1 = 1: plug-in p drops out
    eps = 1e-6
    grpo = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)
    close(adv(g, 1, "grpo", eps=eps), grpo)
    # z-score of s = g/n: the GRPO z-score, with eps acting on std(g)/n (so GRPO's eps is n eps)
    close(adv(g, 1, "bon_mean", eps=eps), adv(g, 1, "grpo", eps=n * eps))
    close(adv(g, 1, "bon_mean", eps=0.0), adv(g, 1, "grpo", eps=0.0))
    c = f.sum(1, keepdim=True)
    q = c / n
    chen = torch.where((c > 0) & (c < n), (f - q) / (torch.sqrt(q * (1 - q)) + eps), 0.0)
    close(adv(f, 1, "chen_passk", eps=eps), chen)  # GRPO with the population std
    close(bk.max_at_k(g, 1), g.mean(1))
    close(bk.pass_at_k(f, 1), f.mean(1))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_k_equal_n_reductions(n):
    rng = random.Random(f"{SEED}-kn-{n}")
    close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    for kind in ("gaussian", "toptie", "tied"):
        g = _rows(rng, kind, n)
        top = g.max(1, keepdim=True).values
        close(adv(g, n, "maxk", scale="sum"), top.expand_as(g))
        tang = adv(g, n, "tang_loo", scale="sum")
        close(adv(g, n, "maxk_loo1", scale="sum"), tang)  # s^(loo-1) at k = n is Tang's LOO
        close(adv(g, n, "bon_mean"), torch.zeros_like(g))  # s is constant: degenerate, 0
        close(bk.max_at_k(g, n), top[:, 0])
        # Tang: only a unique top gets the top1 - top2 gap
        for row, a in zip(g.tolist(), tang.tolist()):
            srt = sorted(row)
            for v, x in zip(row, a):
                want = srt[-1] - srt[-2] if n > 1 and v == srt[-1] and srt.count(v) == 1 else 0.0
                assert abs(x - want) <= 1e-15, (SEED, row, a)
    f = _rows(rng, "bernoulli", n)
    anyc = (f.sum(1, keepdim=True) > 0).to(F64)
    close(adv(f, n, "passk", scale="sum"), anyc.expand_as(f))
    close(adv(f, n, "chen_passk"), torch.zeros_like(f))
    close(bk.pass_at_k(f, n), anyc[:, 0])


def test_bon_max_second_equals_tang_when_the_top_is_unique():
    rng = random.Random(f"{SEED}-second")
    for n in range(2, 9):
        g = _rows(rng, "gaussian", n)  # continuous: the top is unique
        torch.testing.assert_close(adv(g, 1, "bon_max_second", scale="mean"),
                                   adv(g, 1, "tang_loo", scale="sum"), rtol=1e-14, atol=1e-15)
        t = _rows(rng, "toptie", n)  # tied top: tang gives 0, bon_max_second the next gap
        assert torch.all(adv(t, 1, "tang_loo", scale="sum") == 0)


def test_sum_of_s_is_k_times_max_at_k():
    rng = random.Random(f"{SEED}-sum-s")
    for k in range(1, 9):
        groups, _ = random_batch(rng, "maxk", range(k, 9), k)
        r, off, _ = pack(groups)
        s = adv(r, k, "maxk", offsets=off, scale="sum")
        sums = torch.stack([s[off[i]:off[i + 1]].sum() for i in range(len(groups))])
        torch.testing.assert_close(sums, k * bk.max_at_k(r, k, offsets=off), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_scale_rule_mean_is_n_times_sum(name):
    """Groups of different sizes in one batch: each is multiplied by its own n_g."""
    rng = random.Random(f"{SEED}-scale-{name}")
    kw = {}
    if name == "bon_rlb":
        kw["clip"] = (-1e6, 1e6)  # the default clip acts after the scale; keep it out of the way
    for k in (1, 2, 4):
        groups, deltas = random_batch(rng, name, range(1, 9), k)
        if name == "bon_rlb":  # all-fail groups have infinite weights (clipped): compare others
            keep = [i for i, g in enumerate(groups) if any(g)]
            groups = [groups[i] for i in keep]
        r, off, d = pack(groups, deltas)
        sizes = torch.repeat_interleave(torch.diff(off), torch.diff(off)).to(F64)
        mean = adv(r, k, name, offsets=off, deltas=d, scale="mean", **kw)
        total = adv(r, k, name, offsets=off, deltas=d, scale="sum", **kw)
        torch.testing.assert_close(mean, sizes * total, rtol=1e-14, atol=1e-14 * scale_of(groups))


# --------------------------------------------------------------------------------------------
# Constant rewards (spec 8 "constant rewards" column, conventions.md)
# --------------------------------------------------------------------------------------------

def constant_value(name, c, n, k):
    """The documented value (sum scale) of every sample of a group whose rewards all equal c."""
    documented = {
        "maxk": c * k / n, "maxk_offpolicy": c * k / n, "maxk_offpolicy_exact": c * k / n,
        "maxk_loo": -c * k / (n * (n - 1)) if n > 1 else None,
        "passk": k / n if c == 1 else 0.0,
    }
    if name == "bon_rlb_pos" or (name == "bon_rlb" and c == 1):
        # c = n: p = 0, so the weight is k 0^(k-1): 1 at k = 1 (then R/c = 1/n), else 0
        return (1.0 / n if k == 1 else 0.0) if c == 1 else 0.0
    return documented.get(name, 0.0)


@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_constant_rewards(name):
    values = (0.0, 1.0) if name in oracle.BINARY_ONLY else (0.0, 0.75, -2.5, 3.0, 1.0)
    if name in oracle.NON_NEGATIVE:
        values = tuple(v for v in values if v >= 0)
    for n in (1, 2, 3, 5, 8, 37):
        for k in sorted({1, 2, n - 1, n}):
            if k < 1 or k > oracle.k_max(name, n):
                continue
            for c in values:
                r = torch.full((1, n), c, dtype=F64)
                kw = {"deltas": torch.zeros_like(r)} if name in oracle.OFF_POLICY else {}
                got = adv(r, k, name, scale="sum", **kw)[0]
                if name == "bon_rlb" and c == 0:
                    # every sample fails: the wrong weight is +inf, bounded by the default clip
                    want = oracle.BON_RLB_DEFAULT_CLIP[1]
                else:
                    want = constant_value(name, c, n, k)
                assert torch.allclose(got, torch.full_like(got, want), rtol=1e-13, atol=1e-14), (
                    name, n, k, c, got.tolist(), want)


# --------------------------------------------------------------------------------------------
# Large groups: no overflow/underflow/NaN; values against the closed-form oracle
# --------------------------------------------------------------------------------------------

LARGE_N = 4096
EXACT_MAX_N = 256  # maxk_offpolicy_exact's documented limit (its error message says so)


def large_cases(name, n):
    ks = [1] if name in oracle.K_IGNORED else [1, 2, 16, n // 2, n - 1, n]
    if name == "maxk_offpolicy_exact":  # k >= n/2 at n = 256: test_exact_offpolicy_slow_k
        ks = [1, 2, 16]
    return [k for k in ks if 1 <= k <= oracle.k_max(name, n)]


def large_group(rng, name, n):
    if name in oracle.BINARY_ONLY:  # near all-correct groups: test_binary_near_all_correct
        p = rng.choice((0.002, 0.05, 0.5))
        return [float(rng.random() < p) for _ in range(n)]
    g = [rng.random() for _ in range(n)]
    for i in rng.sample(range(n), 20):  # a few ties, one at the top
        g[i] = g[(i + 1) % n]
    g[rng.randrange(n)] = max(g)
    return g


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_large_groups(name, dtype):
    rng = random.Random(f"{SEED}-large-{name}")
    n = EXACT_MAX_N if name == "maxk_offpolicy_exact" else LARGE_N
    g = large_group(rng, name, n)
    g = torch.tensor(g, dtype=dtype).to(F64).tolist()  # the oracle sees the values the op sees
    deltas = None
    if name in oracle.OFF_POLICY:
        deltas = torch.tensor([rng.uniform(-0.5, 0.5) for _ in range(n)], dtype=dtype).to(F64).tolist()
    for k in large_cases(name, n):
        for scale in ("sum", "mean"):
            kw = {} if deltas is None else {"deltas": torch.tensor([deltas], dtype=dtype)}
            got = adv(torch.tensor([g], dtype=dtype), k, name, scale=scale, **kw)[0]
            assert got.dtype == dtype and torch.isfinite(got).all(), (SEED, name, k, scale)
            want = np.array(oracle.expected(name, g, k, scale, deltas=deltas, closed=True))
            assert np.isfinite(want).all()
            mult = n if scale == "mean" else 1
            ref = np.max(np.abs(want)) + max(abs(v) for v in g) * mult / n  # outputs ~ g/n (sum)
            if dtype == torch.float64:
                tol = 1e-9 * ref  # both sides carry float64 rounding of n-term scans
                rtol = 1e-9
            else:  # computed in float64, then cast: a few float32 ulps
                tol = 4 * 2.0**-24 * ref
                rtol = 4 * 2.0**-24
            err = np.abs(got.to(F64).numpy() - want)
            bad = err > tol + rtol * np.abs(want)
            assert not bad.any(), (f"seed={SEED} {name} n={n} k={k} {scale} {dtype}: max err "
                                   f"{err.max():.3e}, tol {tol:.3e}, first bad at {np.argmax(bad)}")


@pytest.mark.parametrize("name,n_wrong,k", [
    (name, n_wrong, k) for name in ("passk", "bon_rlb", "bon_rlb_pos")
    for n_wrong, k in ((1, 2), (2, 2), (5, 3), (19, 16))
] + [("chen_passk", n_wrong, k) for n_wrong, k in ((2, 2), (5, 3), (19, 16))])
def test_binary_near_all_correct(name, n_wrong, k):
    """n = 4096 with only a few failures: pass@k is within 1e-7 of 1 (float64 cancellation)."""
    n = LARGE_N
    g = [1.0] * n
    for i in range(n_wrong):
        g[7 * i] = 0.0
    got = adv(torch.tensor([g], dtype=F64), k, name, scale="mean")[0].numpy()
    want = np.array(oracle.expected(name, g, k, "mean", closed=True))
    err = np.abs(got - want).max() / (np.abs(want).max() + 1.0)  # z-scores: unit scale
    assert err <= 1e-10, f"{name} n={n} c={n - n_wrong} k={k}: relative error {err:.2e}"


def test_closed_forms_agree_with_enumeration():
    """The large-n oracle (closed forms, autograd route for the exact off-policy weights) is the
    enumeration oracle for small n."""
    rng = random.Random(f"{SEED}-closed")
    for name in oracle.ALL_ESTIMATORS:
        kinds = BINARY_KINDS if name in oracle.BINARY_ONLY else REAL_KINDS
        for n in range(1, 8):
            for k in range(1, min(n, oracle.k_max(name, n)) + 1):
                for kind in kinds:
                    g = make_rewards(rng, kind, n)
                    dl = make_deltas(rng, g) if name in oracle.OFF_POLICY else None
                    a = oracle.natural(name, g, k, deltas=dl, clamp_delta=0.5)
                    b = oracle.natural_closed(name, g, k, deltas=dl, clamp_delta=0.5)
                    a = np.array([float(v) for v in a])
                    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-13,
                                               err_msg=f"{SEED} {name} n={n} k={k} {kind} {g}")


@pytest.mark.parametrize("n,k", [(128, 64), (128, 128), (8, 8)])
def test_exact_offpolicy_mid_and_full_k(n, k):
    rng = random.Random(f"{SEED}-exact-{n}-{k}")
    g = [rng.random() for _ in range(n)]
    dl = [rng.uniform(-0.5, 0.5) for _ in range(n)]
    got = adv(torch.tensor([g], dtype=F64), k, "maxk_offpolicy_exact", scale="sum",
              deltas=torch.tensor([dl], dtype=F64))[0].numpy()
    want = oracle.closed_offpolicy_exact(g, k, dl)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max(),
                               err_msg=f"seed={SEED} n={n} k={k}")


@pytest.mark.slow  # the reference takes 0.5-35 s per call here (data-dependent) for k >= n/2
@pytest.mark.parametrize("k", [128, 255, 256])
def test_exact_offpolicy_slow_k(k):
    test_exact_offpolicy_mid_and_full_k(EXACT_MAX_N, k)


def test_exact_offpolicy_rejects_groups_above_its_limit():
    r = torch.rand(1, EXACT_MAX_N + 1, dtype=F64)
    with pytest.raises(ValueError, match=str(EXACT_MAX_N)):
        adv(r, 2, "maxk_offpolicy_exact", deltas=torch.zeros_like(r))


def test_loo1_is_nonnegative_and_binary_closed_form():
    """spec 2.4: s^(loo-1) >= 0, the smallest reward gets 0; on binary rewards a correct sample
    gets C(n-c, k-1)/C(n,k) and a wrong one 0."""
    rng = random.Random(f"{SEED}-loo1-sign")
    for k in range(2, 9):
        groups, _ = random_batch(rng, "maxk_loo1", range(k, 9), k)
        r, off, _ = pack(groups)
        out = adv(r, k, "maxk_loo1", offsets=off, scale="sum").tolist()
        for i, g in enumerate(groups):
            a = out[off[i]:off[i + 1]]
            assert min(a) >= -1e-15 * scale_of(groups), (SEED, g, a)
            assert abs(a[g.index(min(g))]) <= 1e-15 * scale_of(groups), (SEED, g, a)
        binary = [make_rewards(rng, kind, n) for n in range(k, 9) for kind in BINARY_KINDS]
        r, off, _ = pack(binary)
        out = adv(r, k, "maxk_loo1", offsets=off, scale="sum").tolist()
        for i, f in enumerate(binary):
            n, c = len(f), int(sum(f))
            want = [oracle.comb(n - c, k - 1) / oracle.comb(n, k) if v else 0.0 for v in f]
            np.testing.assert_allclose(out[off[i]:off[i + 1]], want, rtol=1e-13, atol=1e-15,
                                       err_msg=f"seed={SEED} f={f} k={k}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", oracle.ALL_ESTIMATORS)
def test_low_precision_is_the_float64_value_rounded(name, dtype):
    """conventions.md: arithmetic in float64, then one cast. So the output is the oracle's value on
    the (exactly upcast) low-precision inputs, rounded once: within one unit of rounding."""
    rng = random.Random(f"{SEED}-lowp-{name}-{dtype}")
    unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}[dtype]
    tiny = {torch.float16: 6e-8, torch.bfloat16: 1e-38, torch.float32: 1e-38}[dtype]
    for k in (1, 2, 3):
        groups, deltas = random_batch(rng, name, range(1, 9), k)
        r, off, d = pack(groups, deltas, dtype=dtype)
        seen = r.to(F64)  # what the op really gets
        seen_d = None if d is None else d.to(F64)
        for scale in ("sum", "mean"):
            out = adv(r, k, name, offsets=off, deltas=d, scale=scale)
            assert out.dtype == dtype
            out = out.to(F64)
            for i in range(len(groups)):
                a, b = int(off[i]), int(off[i + 1])
                g = seen[a:b].tolist()
                dl = None if seen_d is None else seen_d[a:b].tolist()
                want = np.array(oracle.expected(name, g, k, scale, deltas=dl))
                got = out[a:b].numpy()
                # one rounding to dtype, on top of the float64 rounding of the computation itself
                mult = len(g) if scale == "mean" else 1
                f64 = 1e-13 * (np.max(np.abs(want)) + max(abs(v) for v in g) * mult)
                tol = 2 * unit * np.abs(want) + tiny + f64 + zscore_noise(name, g, k, scale, 1e-6)
                assert np.all(np.abs(got - want) <= tol), (
                    f"seed={SEED} {name} {dtype} k={k} {scale} rewards={g} deltas={dl}\n"
                    f"got={got.tolist()}\nwant={want.tolist()}")
