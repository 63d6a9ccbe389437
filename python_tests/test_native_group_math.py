"""The CPU kernel's per-group fixes: MaxRL, exact zeros on constant groups, no overflow in the
z-score, the mixture-table bank, and the NaN/inf contract with checks off.

Each test compares bonkernels._native (the C++ CPU kernel) with a direct float64 construction in
this file, so it does not depend on the other backends.
"""

import math

import pytest
import torch

from bonkernels import _native, estimators

pytestmark = pytest.mark.skipif(not _native.available(), reason=f"native extension not built: {_native.load_error()}")

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def native(values, sizes, name, k=1, *, deltas=None, mean_scale=None, eps=1e-6, small_groups=2, clamp_delta=None,
           clip=(-math.inf, math.inf), max_group_size=None, bank=None, bank_index=None):
    est = estimators.get(name)
    offsets = torch.tensor([0] + list(sizes), dtype=torch.int64).cumsum(0)
    if mean_scale is None:
        mean_scale = est.scale == "mean"
    if est.needs_deltas and deltas is None:
        deltas = torch.zeros_like(values)
    out = torch.full_like(values, 12345.0)  # poison: every element must be written
    kwargs = {} if bank is None else {"bank": bank, "bank_index": bank_index}
    return _native.advantages_packed(values, offsets, deltas, k, est.code, clamp_delta, clip[0], clip[1], mean_scale,
                                     small_groups, eps, max_group_size, out=out, **kwargs)


# ----------------------------------------------------------------------------- maxrl

def maxrl_direct(group):
    g = [float(v) for v in group]
    m = sum(g) / len(g)
    return [0.0 if m == 0 else (v - m) / m for v in g]


def test_maxrl_matches_its_definition():
    gen = torch.Generator().manual_seed(3)
    sizes = [1, 2, 5, 8, 16, 33, 100]
    values = torch.rand(sum(sizes), generator=gen, dtype=torch.float64) * 3
    values[1:3] = 0.0                                   # a group of size 2 with mean 0
    values[3:8] = (torch.rand(5, generator=gen) < 0.4).double()   # binary
    got = native(values, sizes, "maxrl")
    want, start = [], 0
    for n in sizes:
        want += maxrl_direct(values[start:start + n])
        start += n
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert got[0] == 0.0 and bool((got[1:3] == 0).all())       # singleton; mean 0
    sum_scale = native(values, sizes, "maxrl", mean_scale=False)
    n_of = torch.repeat_interleave(torch.tensor(sizes, dtype=torch.float64), torch.tensor(sizes))
    torch.testing.assert_close(sum_scale * n_of, got, rtol=1e-14, atol=1e-14)


# ----------------------------------------------------------------------------- constant groups, overflow

CENTRED = ["grpo", "rloo", "dr_grpo", "bon_mean", "chen_passk", "maxrl", "bon_max_mean"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CENTRED)
def test_constant_groups_are_exactly_zero(name, dtype):
    est = estimators.get(name)
    levels = [1.0, 0.0] if est.binary else [0.5402, -3.1, 1e-3, 0.0, 7.25]
    sizes, parts = [], []
    for n in (1, 2, 3, 16, 17, 40):
        for v in levels:
            parts.append(torch.full((n,), v, dtype=torch.float64))
            sizes.append(n)
    values = torch.cat(parts).to(dtype)
    for eps in (0.0, 1e-6, 1e-2):
        for k in (1, 2):
            got = native(values, sizes, name, k, eps=eps)
            assert bool((got == 0).all()), f"{name} eps={eps} k={k}: {got[got != 0][:4]}"


def test_grpo_float64_extremes_are_finite():
    values = torch.tensor([1.7e308, -1.7e308, 0.0, 1.0], dtype=torch.float64)
    got = native(values, [4], "grpo", eps=0.0)
    mean = 0.25
    res = [1.7e308 - mean, -1.7e308 - mean, -mean, 1 - mean]
    scale = 1.7e308
    sd = scale * math.sqrt(sum((r / scale) ** 2 for r in res) / 3)
    want = torch.tensor([r / sd for r in res], dtype=torch.float64)
    assert torch.isfinite(got).all(), got
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-300)
    # one element far from the rest: its residue exceeds the largest double before scaling
    values = torch.tensor([1.7e308, -1.7e308, -1.7e308, -1.7e308], dtype=torch.float64)
    got = native(values, [4], "grpo", eps=0.0)
    want = torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)
    got = native(torch.tensor([1e-310, 3e-310, 2e-310], dtype=torch.float64), [3], "grpo", eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64), rtol=1e-12, atol=0.0)


# ----------------------------------------------------------------------------- mixture bank

LINEAR = ["maxk", "passk", "maxk_loo", "maxk_loo_centered", "maxk_loo1", "maxk_offpolicy"]


def d_row(n, k, width):
    """d^(n,k)_j = C(j-1,k-1)/C(n,k) for j = 1..width (0 beyond n), from binomials."""
    if k < 1:
        return [0.0] * width
    return [math.comb(j - 1, k - 1) / math.comb(n, k) if j <= n else 0.0 for j in range(1, width + 1)]


def bank_block(name, n, weights, small_groups="clamp"):
    """One block of the bank (backend interface 3): D, O, Q, B, Bp (n each), W1, in float64."""
    est = estimators.get(name)
    limit = n - est.k_margin
    folded = [0.0] * (n + 1)
    for k, w in enumerate(weights, start=1):
        if w == 0:
            continue
        if k > limit and small_groups == "zero":
            return [0.0] * (5 * n + 1)
        if limit >= 1:
            folded[min(k, limit)] += w
    D, O, Q, B, Bp = ([0.0] * n for _ in range(5))
    W1 = 0.0
    for k in range(1, n + 1):
        w = folded[k]
        if w == 0:
            continue
        if name == "maxk_loo1" and k == 1:
            W1 += w
            continue
        d = d_row(n, k, n)
        for j in range(1, n + 1):
            o = d[j - 1] * (k - 1) / (j - 1) if j >= 2 else 0.0
            q = o * (k - 2) / (j - 2) if j >= 3 else 0.0
            D[j - 1] += w * d[j - 1]
            O[j - 1] += w * max(o, 0.0)
            Q[j - 1] += w * max(q, 0.0)
        if name in ("maxk_loo", "maxk_loo_centered"):
            c = k / (n - 1 if name == "maxk_loo" else n)
            r = d_row(n - 1, k, n)
            for j in range(1, n + 1):
                B[j - 1] += w * c * r[j - 1]
                Bp[j - 1] += w * c * r[j - 2] if j >= 2 else 0.0
        elif name == "maxk_loo1":
            r = d_row(n - 1, k - 1, n)
            for j in range(1, n + 1):
                B[j - 1] += w * k / n * r[j - 1]
    return D + O + Q + B + Bp + [W1]


def build_bank(name, sizes, weights, small_groups="clamp"):
    index = torch.full((max(sizes) + 1,), -1, dtype=torch.int64)
    flat = [7.0]  # blocks need not start at 0
    for n in sorted(set(sizes)):
        index[n] = len(flat)
        flat += bank_block(name, n, weights, small_groups)
    return torch.tensor(flat, dtype=torch.float64), index


def bank_values_direct(name, group, deltas, block):
    """The bank formulas of interface 3 in plain Python (sorted order, sum scale), back in place."""
    n = len(group)
    order = sorted(range(n), key=lambda i: group[i])
    x = [float(group[i]) for i in order]
    dl = [float(deltas[i]) for i in order] if deltas is not None else [0.0] * n
    D, O, Q, B, Bp = (block[r * n:(r + 1) * n] for r in range(5))
    W1 = block[5 * n]
    a = []
    for j in range(n):
        if name in ("maxk", "passk"):
            v = D[j] * x[j] + sum(O[t] * x[t] for t in range(j + 1, n))
        elif name in ("maxk_loo", "maxk_loo_centered"):
            v = (D[j] * x[j] + sum(O[t] * x[t] for t in range(j + 1, n))
                 - sum(B[t] * x[t] for t in range(j)) - sum(Bp[t] * x[t] for t in range(j + 1, n)))
        elif name == "maxk_loo1":
            y = [v - x[0] for v in x]
            v = D[j] * y[j] - sum(B[t] * y[t] for t in range(j))
            if n > 1:
                v += W1 * (x[j] - (sum(x) - x[j]) / (n - 1)) / n
        else:  # maxk_offpolicy, spec 3.2 with D, O, Q: sum over subsets containing j, by ranks
            dsum = sum(dl[:j])
            v = ((1 + dl[j]) * (D[j] * x[j] + sum(O[t] * x[t] for t in range(j + 1, n)))
                 + O[j] * dsum * x[j] + sum(O[t] * dl[t] * x[t] for t in range(j + 1, n))
                 + sum(Q[t] * sum(dl[:t]) * x[t] for t in range(j + 1, n))
                 - dl[j] * sum(Q[t] * x[t] for t in range(j + 1, n)))
        a.append(v)
    out = [0.0] * n
    for s, i in enumerate(order):
        out[i] = a[s]
    return out


MIXES = [[1.0], [0.0, 1.0], [1.0, 1 / 2, 1 / 3, 1 / 4], [0.2, 0.0, 0.0, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]]


@pytest.mark.parametrize("name", LINEAR)
def test_bank_matches_direct_construction_and_single_k_sum(name):
    est = estimators.get(name)
    gen = torch.Generator().manual_seed(40 + est.code)
    sizes = [1, 2, 3, 5, 8, 13, 4, 40, 2, 70]
    N = sum(sizes)
    if est.binary:
        values = (torch.rand(N, generator=gen) < 0.4).double()
    else:
        values = torch.randint(0, 5, (N,), generator=gen).double() / 4 + torch.randn(N, generator=gen) * 0.1
    deltas = (torch.rand(N, generator=gen, dtype=torch.float64) - 0.5) * 0.6 if est.needs_deltas else None
    for weights in MIXES:
        bank, index = build_bank(name, sizes, weights)
        for mean_scale in (False, True):
            got = native(values, sizes, name, 3, deltas=deltas, mean_scale=mean_scale, bank=bank, bank_index=index)
            want, start = [], 0
            for n in sizes:
                block = bank[int(index[n]):int(index[n]) + 5 * n + 1].tolist()
                part = bank_values_direct(name, values[start:start + n].tolist(),
                                          None if deltas is None else deltas[start:start + n].tolist(), block)
                want += [v * (n if mean_scale else 1) for v in part]
                start += n
            torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-11, atol=1e-12)
        # linearity: the weighted sum of single-k calls with small_groups = "clamp"
        single = sum(w * native(values, sizes, name, k, deltas=deltas, mean_scale=False)
                     for k, w in enumerate(weights, start=1) if w)
        got = native(values, sizes, name, 1, deltas=deltas, mean_scale=False, bank=bank, bank_index=index)
        torch.testing.assert_close(got, single, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_bank_low_precision_and_zero_blocks(dtype):
    sizes = [3, 6, 2]
    values = torch.tensor([0.5, 0.0, 1.0, 0.25, 0.75, 0.5, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    bank, index = build_bank("maxk", sizes, [0.0, 0.0, 0.0, 1.0], small_groups="zero")
    got = native(values.to(dtype), sizes, "maxk", 1, mean_scale=False, bank=bank, bank_index=index)
    assert got.dtype == dtype and bool((got[:3] == 0).all()) and bool((got[9:] == 0).all())  # n = 3, 2 < k = 4
    want = native(values[3:9].to(dtype), [6], "maxk", 4, mean_scale=False)
    assert torch.equal(got[3:9], want)


def test_bank_arguments_are_checked():
    values = torch.rand(6, dtype=torch.float64)
    bank, index = build_bank("maxk", [6], [1.0, 1.0])
    with pytest.raises(ValueError, match="go together"):
        native(values, [6], "maxk", 1, bank=bank, bank_index=None)
    with pytest.raises(ValueError, match="not linear"):
        native(values, [6], "grpo", 1, bank=bank, bank_index=index)
    with pytest.raises(TypeError, match="float64"):
        native(values, [6], "maxk", 1, bank=bank.float(), bank_index=index)
    # a size without a block, or an index past the bank: NaN for that group, nothing read outside
    got = native(torch.rand(9, dtype=torch.float64), [6, 3], "maxk", 1, bank=bank, bank_index=index)
    assert torch.isfinite(got[:6]).all() and torch.isnan(got[6:]).all()
    bad = index.clone()
    bad[6] = bank.numel() - 5
    assert torch.isnan(native(values, [6], "maxk", 1, bank=bank, bank_index=bad)).all()


# ----------------------------------------------------------------------------- non-finite inputs, undersized bound

NATIVE = [e for e in estimators.REGISTRY.values() if e.code not in _native.UNSUPPORTED_CODES]


def run_in_guarded_buffer(values, offsets, deltas, est, k=2, max_group_size=None):
    """Run with `out` a view into a larger poisoned buffer; return the view and whether the guard
    elements on both sides survived (nothing written outside the output)."""
    N = values.numel()
    buf = torch.full((N + 2,), 777.0, dtype=values.dtype)
    out = buf[1:N + 1]
    out.fill_(12345.0)
    _native.advantages_packed(values, offsets, deltas, k, est.code, None, -math.inf, math.inf, True, 2, 1e-6,
                              max_group_size, out=out)
    return out, bool(buf[0] == 777.0 and buf[-1] == 777.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("est", NATIVE, ids=lambda e: e.name)
def test_non_finite_group_is_all_nan_and_others_untouched(est, dtype):
    """Checks off (interface 4): a NaN or +-inf reward (or delta) makes its whole group NaN."""
    gen = torch.Generator().manual_seed(900 + est.code)
    sizes = [5, 1, 24, 25, 29, 32, 33, 64, 65, 200, 3]
    offsets = torch.tensor([0] + sizes).cumsum(0)
    N = sum(sizes)
    if est.binary:
        clean = (torch.rand(N, generator=gen) < 0.5).double()
    else:
        clean = torch.randint(0, 6, (N,), generator=gen).double() / 4 + 0.25
    deltas = (torch.rand(N, generator=gen, dtype=torch.float64) - 0.5) * 0.4 if est.needs_deltas else None
    bad_groups = [0, 1, 3, 4, 5, 6, 7, 8, 9]
    for bad in (math.nan, math.inf, -math.inf):
        values = clean.clone()
        d = None if deltas is None else deltas.clone()
        for n_bad, g in enumerate(bad_groups):
            start, n = int(offsets[g]), sizes[g]
            values[start + (n_bad * 7) % n] = bad
            if n > 4:
                values[start + n - 2] = bad
        for target in (["values"] + (["deltas"] if est.needs_deltas else [])):
            v = values if target == "values" else clean
            dd = d
            if target == "deltas":
                dd = deltas.clone()
                for g in bad_groups:
                    dd[int(offsets[g]) + sizes[g] // 2] = bad
            want_clean, _ = run_in_guarded_buffer(clean.to(dtype), offsets, None if deltas is None else deltas.to(dtype), est)
            got, guarded = run_in_guarded_buffer(v.to(dtype), offsets, None if dd is None else dd.to(dtype), est)
            assert guarded, f"{est.name}: wrote outside the output"
            assert not bool((got == 12345.0).any()), f"{est.name}: outputs left unwritten"
            for g, n in enumerate(sizes):
                part = got[int(offsets[g]):int(offsets[g]) + n]
                if g in bad_groups:
                    assert torch.isnan(part).all(), f"{est.name} {target}={bad} group {g}: {part[:6]}"
                else:
                    ref = want_clean[int(offsets[g]):int(offsets[g]) + n]
                    assert torch.equal(part, ref), f"{est.name}: clean group {g} changed"


@pytest.mark.parametrize("est", [estimators.get(n) for n in ("maxk", "grpo", "maxk_offpolicy", "maxrl")],
                         ids=lambda e: e.name)
def test_undersized_max_group_size_nan_fills_the_larger_groups(est):
    sizes = [3, 9, 4, 12, 1]
    offsets = torch.tensor([0] + sizes).cumsum(0)
    values = torch.rand(sum(sizes), dtype=torch.float64)
    deltas = torch.zeros_like(values) if est.needs_deltas else None
    full, _ = run_in_guarded_buffer(values, offsets, deltas, est)
    got, guarded = run_in_guarded_buffer(values, offsets, deltas, est, max_group_size=4)
    assert guarded
    for g, n in enumerate(sizes):
        part, ref = (t[int(offsets[g]):int(offsets[g]) + n] for t in (got, full))
        assert torch.isnan(part).all() if n > 4 else torch.equal(part, ref), (g, part)
    with pytest.raises(ValueError, match="max_group_size"):
        run_in_guarded_buffer(values, offsets, deltas, est, max_group_size=-1)
