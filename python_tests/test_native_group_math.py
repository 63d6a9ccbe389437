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
