"""The Triton advantages kernel: exact zeros on constant groups, float64 extremes, `maxrl`, and
mixtures over k read from a bank of weight tables (bank mode).

Runs under Triton's interpreter (TRITON_INTERPRET=1, see test_triton_interpreter.py) or on a GPU.
The bank is built here from the reference's single-k tables, block by block as the backend
interface lays it out (bonkernels/triton/advantages.py, `bank`/`bank_index`).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU (test_triton.py runs it under the interpreter)",
                allow_module_level=True)
pytest.importorskip("triton")
DEVICE = "cpu" if INTERPRETING else "cuda"
pytestmark = pytest.mark.usefixtures("lanes_at_every_batch_size")  # see conftest.py

from bonkernels import reference  # noqa: E402
from bonkernels import triton as bk_triton  # noqa: E402
from bonkernels.triton import _facts  # noqa: E402

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def packed_offsets(sizes) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(sizes, dtype=torch.int64).cumsum(0)),
                        dtype=torch.int64, device=DEVICE)


def launch(values, sizes, name, k=2, deltas=None, mean_scale=True, eps=1e-6, mode=2, **bank):
    est = _facts.get(name)
    return bk_triton.advantages_packed(values, packed_offsets(sizes), deltas, k, est.code, None,
                                       -math.inf, math.inf, mean_scale, mode, eps, None, **bank)


# ---------------------------------------------------------------- constant groups

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "bon_mean", "chen_passk", "maxrl"])
def test_constant_groups_are_exactly_zero(name, dtype):
    """Equal rewards give exactly 0 at every eps, including 0 (grpo gave NaN at eps=0)."""
    binary = _facts.get(name).binary
    levels = [1.0, 0.0, 1.0, 0.0] if binary else [0.5402, 3.0e-5, 7.25, 0.0]
    sizes = [16, 5, 8, 3]
    values = torch.cat([torch.full((n,), v, dtype=torch.float64) for n, v in zip(sizes, levels)])
    values = values.to(device=DEVICE, dtype=dtype)
    for eps in (0.0, 1e-6):
        for mean_scale in (True, False):
            out = launch(values, sizes, name, eps=eps, mean_scale=mean_scale)
            assert (out == 0).all(), (name, dtype, eps, mean_scale, out)


def _scaled_zscore(xs, eps):
    """(x - mean)/(sample std + eps), exactly in rationals after an exact power-of-two scaling."""
    unit = Fraction(2) ** 1023
    u = [Fraction(x) / unit for x in xs]
    mean = sum(u) / len(u)
    std = math.sqrt(float(sum((v - mean) ** 2 for v in u) / (len(u) - 1)))
    return [float(v - mean) / (std + eps / float(unit)) for v in u]


def test_float64_extremes_give_finite_true_values():
    """Differences and squares of rewards near the float64 limit must not overflow."""
    xs = [1.7e308, -1.7e308, 0.0, 1.0]
    values = torch.tensor(xs, dtype=torch.float64, device=DEVICE)
    got = launch(values, [4], "grpo").tolist()
    want = _scaled_zscore(xs, 1e-6)
    assert all(math.isfinite(a) for a in got), got
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-14 * max(abs(b), 1e-300) or abs(a - b) < 1e-300, (got, want)
    got = launch(values, [4], "dr_grpo").tolist()
    mean = sum(Fraction(x) for x in xs) / 4
    want = [float(Fraction(x) - mean) for x in xs]
    assert all(math.isfinite(a) for a in got), got
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-15 * 1.7e308, (got, want)


# ---------------------------------------------------------------- maxrl

def maxrl_expected(values, sizes, mean_scale):
    out, start = [], 0
    for n in sizes:
        g = [Fraction(v) for v in values[start:start + n]]
        m = sum(g) / n if n else 0
        for v in g:
            a = 0.0 if n < 2 or m == 0 else float((v - m) / m)
            out.append(a if mean_scale else a / n)
        start += n
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_maxrl_matches_its_formula(dtype):
    """(r_i - mean)/mean per group in the mean scale, divided by n in the sum scale, 0 when the mean
    is 0 and for singletons; continuous and binary rewards, ragged groups, both sort paths."""
    generator = torch.Generator().manual_seed(17)
    for sizes in ([5, 1, 8, 3, 0, 7, 4], [40, 2, 64]):
        parts = []
        for i, n in enumerate(sizes):
            if i % 3 == 0:
                parts.append((torch.rand(n, generator=generator) < 0.4).double())  # binary
            elif i % 3 == 1:
                parts.append(torch.zeros(n, dtype=torch.float64))  # mean 0
            else:
                parts.append(torch.rand(n, generator=generator, dtype=torch.float64) * 3)
        values = torch.cat(parts).to(device=DEVICE, dtype=dtype)
        for mean_scale in (True, False):
            got = launch(values, sizes, "maxrl", k=10**9, mean_scale=mean_scale).double().cpu()
            want = maxrl_expected(values.double().cpu().tolist(), sizes, mean_scale)
            rtol = {torch.float64: 1e-13, torch.float32: 2**-22, torch.bfloat16: 2**-7}[dtype]
            torch.testing.assert_close(got, want.to(dtype).double(), rtol=rtol, atol=1e-12)


def test_maxrl_divides_by_means_near_the_float64_limits():
    """The kernel divides a group by its mean through one reciprocal per group (_over): a mean
    beyond 2^1000, below 2^-1000 or subnormal is rescaled first, else its reciprocal would lose
    bits or overflow. Every group here has the answer of the plain division, to an ulp or so."""
    groups = [[1e305, 3e305, 2e305, 5e304], [1e-305, 3e-305, 0.0, 2e-305],
              [3e-310, 1e-309, 0.0, 5e-311], [8e307, 2e307, 0.0, 5e307], [1.0, 3.0, 2.0, 0.5]]
    sizes = [len(g) for g in groups]
    flat = [v for g in groups for v in g]
    values = torch.tensor(flat, dtype=torch.float64, device=DEVICE)
    for mean_scale in (True, False):
        got = launch(values, sizes, "maxrl", mean_scale=mean_scale).cpu()
        want = maxrl_expected(flat, sizes, mean_scale)
        assert torch.isfinite(got).all(), got
        # subnormal rewards carry ~40 bits, and their mean rounds at 2^-1074: a looser bound there
        rtol = torch.tensor([1e-12 if g[0] < 1e-300 and g[0] > 0 else 1e-14
                             for g in groups for _ in g], dtype=torch.float64)
        assert ((got - want).abs() <= rtol * want.abs()).all(), (got, want)


# ---------------------------------------------------------------- mixtures: bank mode

LINEAR = ("maxk", "passk", "maxk_loo", "maxk_loo_centered", "maxk_loo1", "maxk_offpolicy")


def _table(n, k, width):
    d, o, q = reference.weight_tables(torch.tensor([n]), torch.tensor([k]), width)
    return d[0], o[0], q[0]


def build_bank(name, sizes, weights):
    """(bank, bank_index) of the mixture sum_k weights[k] * tables(k), one block per group size:
    rows D, O, Q, B, Bp of length n, then W1."""
    max_n = max(sizes)
    index = torch.full((max_n + 1,), -1, dtype=torch.int64)
    blocks, at = [], 0
    for n in sorted(set(s for s in sizes if s > 0)):
        D, O, Q, B, Bp = (torch.zeros(n, dtype=torch.float64) for _ in range(5))
        W1 = 0.0
        for k, w in weights.items():
            if name == "maxk_loo1" and k == 1:
                W1 += w
                continue
            d, o, q = _table(n, k, n)
            D, O, Q = D + w * d, O + w * o, Q + w * q
            if name in ("maxk_loo", "maxk_loo_centered"):
                c = k / (n - 1) if name == "maxk_loo" else k / n
                rest = _table(n - 1, k, n)[0]
                B = B + w * c * rest
                Bp = Bp + w * c * torch.cat([torch.zeros(1, dtype=torch.float64), rest[:-1]])
            elif name == "maxk_loo1":
                B = B + w * (k / n) * _table(n - 1, k - 1, n)[0]
        index[n] = at
        block = torch.cat([D, O, Q, B, Bp, torch.tensor([W1], dtype=torch.float64)])
        blocks.append(block)
        at += block.numel()
    return torch.cat(blocks).to(DEVICE), index.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", LINEAR)
def test_bank_mode_equals_the_weighted_sum_of_single_k_launches(name, dtype):
    est = _facts.get(name)
    generator = torch.Generator().manual_seed(100 + est.code)
    weights = {1: 1.0, 2: 0.5, 3: 1.0 / 3.0}  # MaxRL's harmonic weights, T = 3
    if est.k_margin:
        weights = {1: 0.25, 3: 2.0}
    layouts = [[5, 4, 8, 6, 7]] + ([[40, 4, 33]] if dtype == torch.float64 else [])
    for sizes in layouts:  # a thread per group, a group across threads
        n_total = sum(sizes)
        if est.binary:
            values = (torch.rand(n_total, generator=generator) < 0.5).double()
        else:
            values = torch.randn(n_total, generator=generator, dtype=torch.float64)
        values = values.to(device=DEVICE, dtype=dtype)
        deltas = None
        if est.needs_deltas:
            deltas = ((torch.rand(n_total, generator=generator, dtype=torch.float64) - 0.5) * 0.6
                      ).to(device=DEVICE, dtype=dtype)
        bank, bank_index = build_bank(name, sizes, weights)
        for mean_scale in (False, True):
            mixed = launch(values, sizes, name, k=10**9, deltas=deltas, mean_scale=mean_scale,
                           bank=bank, bank_index=bank_index).double()
            singles = sum(w * launch(values, sizes, name, k=k, deltas=deltas, mode=0,
                                     mean_scale=mean_scale).double()
                          for k, w in weights.items())
            # both in float64 inside; the output dtype rounds each launch once
            tol = 1e-12 if dtype == torch.float64 else 4 * 2.0 ** -24 * sum(weights.values())
            scale = max(singles.abs().max().item(), 1.0)
            assert (mixed - singles).abs().max().item() <= tol * scale, (name, sizes, mean_scale)


def test_bank_block_missing_for_a_size_gives_nan():
    """A group whose size has no block (bank_index -1 or past its end) is NaN, never garbage."""
    sizes = [4, 5, 6]
    values = torch.rand(sum(sizes), dtype=torch.float64, device=DEVICE)
    bank, bank_index = build_bank("maxk", [4, 5], {1: 1.0, 2: 1.0})
    out = launch(values, sizes, "maxk", bank=bank, bank_index=bank_index)
    assert torch.isfinite(out[:9]).all() and out[9:].isnan().all()


def test_bank_refused_for_estimators_that_are_not_linear_in_tables():
    values = torch.rand(4, dtype=torch.float64, device=DEVICE)
    bank, bank_index = build_bank("maxk", [4], {1: 1.0})
    with pytest.raises(ValueError, match="mixture bank"):
        launch(values, [4], "grpo", bank=bank, bank_index=bank_index)
