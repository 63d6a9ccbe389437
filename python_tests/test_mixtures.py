"""Mixtures over k (``k_weights``) and MaxRL (spec 12): exact unbiasedness by enumeration,
linearity, the metric, the weight helpers and the argument checks (reference backend)."""

from __future__ import annotations

import math

import pytest
import torch

import bonkernels as bk
from bonkernels import tables

try:
    from .mixture_toy import Toy
except ImportError:
    from mixture_toy import Toy

LOGITS = (0.4, -0.3, 0.2, -0.6)
TOYS = {
    "binary": Toy(LOGITS, (0.0, 1.0, 0.0, 1.0)),
    "continuous": Toy(LOGITS, (0.1, 0.5, 0.5, 0.9)),     # a tie between outcomes 1 and 2
}


def _weightings(n: int, k_margin: int):
    T = n - k_margin
    return {
        "harmonic": bk.maxrl_weights(T),
        "uniform": [1.0] * T,
        "sparse": [0.0] * (T - 1) + [2.0],
        "random": [0.3, 0.0, 1.7, 0.5, 0.25, 0.9][:T],
    }


def _advantages(toy: Toy, outcomes: torch.Tensor, estimator: str, **kw) -> torch.Tensor:
    rewards = toy.g[outcomes]
    if estimator.startswith("maxk_offpolicy"):
        kw["deltas"] = torch.zeros_like(rewards)          # on-policy: the first-order form is exact
    return bk.advantages(rewards, estimator=estimator, scale="sum", backend="torch", **kw)


ESTIMATORS = {"maxk": 0, "maxk_loo": 1, "maxk_loo_centered": 1, "maxk_loo1": 0, "passk": 0,
              "maxk_offpolicy": 0, "maxk_offpolicy_exact": 0}


# ----------------------------------------------------------------------------- unbiasedness

@pytest.mark.parametrize("rewards", sorted(TOYS))
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("n", [3, 5])
def test_mixture_is_unbiased_for_the_mixed_objective(rewards, estimator, n):
    if estimator == "passk" and rewards != "binary":
        pytest.skip("passk takes binary rewards")
    toy = TOYS[rewards]
    outcomes, probs = toy.multisets(n)
    for name, w in _weightings(n, ESTIMATORS[estimator]).items():
        A = _advantages(toy, outcomes, estimator, k_weights=w)
        expected = toy.expectation(outcomes, probs, A)
        truth = toy.grad_mixture(w)
        assert torch.allclose(expected, truth, atol=1e-13, rtol=1e-12), (name, expected, truth)


@pytest.mark.parametrize("estimator", ["maxk", "maxk_loo_centered", "maxk_loo1", "maxk_offpolicy"])
@pytest.mark.parametrize("small_groups", ["clamp", "zero"])
def test_ragged_groups_are_unbiased_for_their_own_objective(estimator, small_groups):
    """One packed call over groups of sizes 2..5 with weights up to k = 5: every size is unbiased
    for the mixture after its too-small rule ("clamp": the weight of k > limit moves to the limit;
    "zero": a size below the largest weighted k gets 0)."""
    toy = TOYS["continuous"]
    w = [0.5, 0.0, 1.0, 0.3, 0.7]
    margin = ESTIMATORS[estimator]
    blocks, offsets = [], [0]
    for n in (2, 3, 4, 5):
        outcomes, probs = toy.multisets(n)
        blocks.append((n, outcomes, probs))
    packed = torch.cat([o.reshape(-1) for _, o, _ in blocks])
    for n, o, _ in blocks:
        offsets += [offsets[-1] + n * (i + 1) for i in range(o.shape[0])]
    offsets = torch.tensor(offsets, dtype=torch.int64)
    rewards = toy.g[packed]
    kw = {"deltas": torch.zeros_like(rewards)} if estimator == "maxk_offpolicy" else {}
    A = bk.advantages(rewards, estimator=estimator, k_weights=w, offsets=offsets, scale="sum",
                      backend="torch", small_groups=small_groups, **kw)
    start = 0
    for n, outcomes, probs in blocks:
        a = A[start:start + outcomes.numel()].reshape(outcomes.shape)
        start += outcomes.numel()
        limit = n - margin
        if small_groups == "clamp":
            folded = list(w[:limit])
            folded[-1] += sum(w[limit:])
            truth = toy.grad_mixture(folded)
        else:
            truth = toy.grad_mixture(w) if len(w) <= limit else torch.zeros(toy.K, dtype=torch.float64)
        assert torch.allclose(toy.expectation(outcomes, probs, a), truth, atol=1e-13), (n, small_groups)


# ----------------------------------------------------------------------------- MaxRL (spec 12)

@pytest.mark.parametrize("N", [2, 3, 4, 5, 6])
def test_maxrl_is_unbiased_for_order_n_minus_1_not_n(N):
    toy = TOYS["binary"]
    outcomes, probs = toy.multisets(N)
    A = _advantages(toy, outcomes, "maxrl")
    expected = toy.expectation(outcomes, probs, A)
    assert torch.allclose(expected, toy.grad_harmonic(N - 1), atol=1e-14)
    gap = (expected - toy.grad_harmonic(N)).abs().max()
    assert gap > 1e-4, f"maxrl matched H_N too (gap {gap})"


@pytest.mark.parametrize("N", [2, 4, 6])
def test_success_average_is_unbiased_for_order_n(N):
    """MaxRL's Theorem 2 on the same toy: (1/c) sum over successes (0 when c = 0) hits H_N."""
    toy = TOYS["binary"]
    outcomes, probs = toy.multisets(N)
    r = toy.g[outcomes]
    c = r.sum(1, keepdim=True)
    A = torch.where(c > 0, r / c.clamp(min=1), torch.zeros_like(r))
    assert torch.allclose(toy.expectation(outcomes, probs, A), toy.grad_harmonic(N), atol=1e-14)


def test_harmonic_loo1_mixture_beats_maxrl_variance():
    """The harmonic s^(loo-1) mixture over k = 1..N-1 targets the same H_{N-1} as maxrl, with lower
    total variance on the toy (numbers quoted in docs/spec.md section 12)."""
    toy = TOYS["binary"]
    for N in (3, 4, 5, 6):
        outcomes, probs = toy.multisets(N)
        A_mix = _advantages(toy, outcomes, "maxk_loo1", k_weights=bk.maxrl_weights(N - 1))
        A_rl = _advantages(toy, outcomes, "maxrl")
        assert torch.allclose(toy.expectation(outcomes, probs, A_mix), toy.grad_harmonic(N - 1), atol=1e-14)
        v_mix = toy.total_variance(outcomes, probs, A_mix)
        v_rl = toy.total_variance(outcomes, probs, A_rl)
        assert v_mix < v_rl, (N, v_mix, v_rl)


def test_maxrl_values_and_rules():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.2, 0.6, 0.0, 1.0]],
                     dtype=torch.float64)
    a = bk.advantages(r, estimator="maxrl", backend="torch")
    assert torch.equal(a[0], torch.tensor([3.0, -1.0, -1.0, -1.0], dtype=torch.float64))
    assert torch.equal(a[1], torch.zeros(4, dtype=torch.float64))         # mean 0: no signal
    assert torch.equal(a[2], torch.zeros(4, dtype=torch.float64))         # constant: exactly 0
    m = r[3].mean()
    assert torch.allclose(a[3], (r[3] - m) / m, rtol=1e-15)
    s = bk.advantages(r, estimator="maxrl", backend="torch", scale="sum")
    assert torch.allclose(s, a / 4, rtol=0, atol=0)
    single = bk.advantages(torch.tensor([0.7, 0.0, 1.0, 0.3]), estimator="maxrl", backend="torch",
                           offsets=torch.tensor([0, 1, 2, 4]))
    assert torch.equal(single[:2], torch.zeros(2))                        # (r - r) / r = 0
    # k is ignored (and may be omitted); it may not be mixed
    assert torch.equal(bk.advantages(r, 3, "maxrl", backend="torch"), a)
    with pytest.raises(ValueError, match="maxrl.*ignores k"):
        bk.advantages(r, estimator="maxrl", k_weights=[1.0], backend="torch")


def test_maxrl_rejects_negative_rewards_naming_the_group():
    r = torch.tensor([[1.0, 0.0], [0.5, -0.1]])
    with pytest.raises(ValueError, match=r"maxrl needs rewards >= 0.*group 1"):
        bk.advantages(r, estimator="maxrl", backend="torch")


# ----------------------------------------------------------------------------- linearity, metric

@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_mixture_equals_weighted_sum_of_single_k_calls(estimator):
    g = torch.Generator().manual_seed(5)
    sizes = [7, 1, 4, 9, 2, 7]
    offsets = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)), dtype=torch.int64)
    r = torch.rand(int(offsets[-1]), generator=g, dtype=torch.float64)
    if estimator == "passk":
        r = (r > 0.5).to(torch.float64)
    kw = dict(offsets=offsets, backend="torch", small_groups="clamp", scale="mean")
    if estimator.startswith("maxk_offpolicy"):
        kw["deltas"] = 0.2 * torch.rand(r.shape, generator=g, dtype=torch.float64) - 0.1
    w = [0.4, 1.1, 0.0, 0.7]
    mixed = bk.advantages(r, estimator=estimator, k_weights=w, **kw)
    # per group, "clamp" moves the weight of k > limit to the limit: the sum of clamped single-k calls
    summed = sum(wk * bk.advantages(r, k, estimator, **kw) for k, wk in enumerate(w, start=1) if wk)
    assert torch.allclose(mixed, summed, rtol=1e-13, atol=1e-14)


def test_mixed_metrics_are_weighted_sums():
    g = torch.Generator().manual_seed(2)
    r = torch.rand(5, 8, generator=g, dtype=torch.float64)
    w = [0.2, 0.0, 1.5, 0.3]
    mixed = bk.max_at_k(r, k_weights=w)
    assert torch.allclose(mixed, sum(wk * bk.max_at_k(r, k) for k, wk in enumerate(w, 1) if wk), rtol=1e-14)
    c = (r > 0.6).to(torch.float64)
    mixed = bk.pass_at_k(c, k_weights=torch.tensor(w, dtype=torch.float64))
    assert torch.allclose(mixed, sum(wk * bk.pass_at_k(c, k) for k, wk in enumerate(w, 1) if wk), rtol=1e-14)
    with pytest.raises(ValueError, match="k <= n"):
        bk.max_at_k(r[:, :2], k_weights=w)


# ----------------------------------------------------------------------------- helpers

def test_maxrl_weights():
    assert bk.maxrl_weights(4) == (1.0, 0.5, 1.0 / 3, 0.25)
    with pytest.raises(ValueError):
        bk.maxrl_weights(0)


def test_anneal_k_weights_interpolates_between_integer_ks():
    assert bk.anneal_k_weights(8, 1, 0.0) == tuple([0.0] * 7 + [1.0])
    assert bk.anneal_k_weights(8, 1, 1.0) == tuple([1.0] + [0.0] * 7)
    w = bk.anneal_k_weights(8, 1, 0.5)                    # k(p) = 4.5
    assert w[3] == pytest.approx(0.5) and w[4] == pytest.approx(0.5) and sum(w) == pytest.approx(1.0)
    w = bk.anneal_k_weights(2, 6, 0.3)                    # k(p) = 3.2
    assert w[2] == pytest.approx(0.8) and w[3] == pytest.approx(0.2) and len(w) == 6
    assert bk.anneal_k_weights(4, 4, 0.7) == (0.0, 0.0, 0.0, 1.0)
    assert bk.anneal_k_weights(8, 1, 2.0) == bk.anneal_k_weights(8, 1, 1.0)   # progress is clipped
    for p in [i / 20 for i in range(21)]:
        w = bk.anneal_k_weights(8, 1, p)
        assert sum(w) == pytest.approx(1.0) and sum(k * v for k, v in enumerate(w, 1)) == pytest.approx(8 - 7 * p)
    with pytest.raises(ValueError):
        bk.anneal_k_weights(0, 3, 0.5)


# ----------------------------------------------------------------------------- argument checks

@pytest.mark.parametrize("bad, error, match", [
    ([1.0, -0.5], ValueError, "k = 2"),
    ([0.0, 0.0], ValueError, "non-zero"),
    ([], ValueError, "non-zero"),
    ([1.0, math.nan], ValueError, "finite"),
    ([1.0, math.inf], ValueError, "finite"),
    (torch.ones(2, 2), ValueError, "1-D"),
    ("harmonic", TypeError, "sequence"),
    (3, TypeError, "sequence"),
    ([1.0, "a"], TypeError, "k = 2"),
    ([True], TypeError, "k = 1"),
])
def test_bad_k_weights_are_rejected(bad, error, match):
    with pytest.raises(error, match=match):
        bk.advantages(torch.rand(2, 4), estimator="maxk", k_weights=bad, backend="torch")


def test_k_and_k_weights_rules():
    r = torch.rand(3, 4)
    with pytest.raises(ValueError, match="either k or k_weights"):
        bk.advantages(r, 2, "maxk", k_weights=[1.0], backend="torch")
    with pytest.raises(TypeError, match="needs k"):
        bk.advantages(r, estimator="maxk", backend="torch")
    for name in ("bon_mean", "chen_passk", "bon_rlb", "bon_rlb_pos"):
        with pytest.raises(ValueError, match="not linear"):
            bk.advantages((r > 0.5).float(), estimator=name, k_weights=[1.0], backend="torch")
    with pytest.raises(ValueError, match="ignores k"):
        bk.advantages(r, estimator="grpo", k_weights=[1.0], backend="torch")
    # the k rules apply to the largest k with a non-zero weight; trailing zeros do not count
    with pytest.raises(ValueError, match=r"k <= n - 1.*k = 4"):
        bk.advantages(r, estimator="maxk_loo", k_weights=[1, 0, 0, 1], backend="torch")
    bk.advantages(r, estimator="maxk_loo", k_weights=[1, 0, 1, 0, 0], backend="torch")
    with pytest.raises(ValueError, match="k <= n"):
        bk.advantages(r, estimator="maxk", k_weights=[1, 0, 0, 0, 1], backend="torch")
    zeroed = bk.advantages(r, estimator="maxk", k_weights=[1, 0, 0, 0, 1], backend="torch", small_groups="zero")
    assert torch.equal(zeroed, torch.zeros_like(r))


def test_bank_covers_every_size_without_a_sync_when_bounded():
    offsets = torch.tensor([0, 3, 5, 9])
    assert tables.bank_sizes(offsets, max_group_size=6) == (1, 2, 3, 4, 5, 6)
    assert tables.bank_sizes(offsets, max_group_size=1000) == (2, 3, 4)
    assert tables.bank_sizes(offsets, full_size=8) == (8,)
    r = torch.rand(9, dtype=torch.float64)
    a = bk.advantages(r, estimator="maxk_loo1", k_weights=[1, 1, 1], offsets=offsets, backend="torch",
                      max_group_size=6, small_groups="clamp")
    b = bk.advantages(r, estimator="maxk_loo1", k_weights=[1, 1, 1], offsets=offsets, backend="torch",
                      small_groups="clamp")
    assert torch.equal(a, b)


def test_tables_are_cached_and_fold_the_too_small_rule():
    w = tables.normalize_k_weights([1.0, 0.5, 0.25])
    first = tables.build_bank("maxk", w, (3, 5), 2, "cpu")
    assert tables.build_bank("maxk", w, (5, 3), 2, "cpu") is first
    bank, index = first
    assert index.tolist() == [-1, -1, -1, 0, -1, 16]
    D3 = bank[0:3]
    assert torch.allclose(D3.sum(), torch.tensor(1.75, dtype=torch.float64))   # sum_j d_j = 1 per k
    zero_bank, zero_index = tables.build_bank("maxk", w, (2,), 1, "cpu")
    assert torch.equal(zero_bank, torch.zeros_like(zero_bank))                  # "zero": all-zero block
    clamp_bank, _ = tables.build_bank("maxk", w, (2,), 2, "cpu")
    assert clamp_bank[0:2].sum() == pytest.approx(1.75)                          # weight moved to k = 2


def test_large_group_tables_stay_finite():
    """The downward recurrence at n = 1024 with T = n harmonic weights: finite, and D sums to H_T."""
    w = bk.maxrl_weights(1024)
    block = tables.size_block("maxk", 1024, tables.normalize_k_weights(w), 0)
    D = block[:1024]
    assert torch.isfinite(block).all()
    assert D.sum().item() == pytest.approx(sum(w), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_maxrl_is_the_harmonic_centered_loo_mixture_for_binary_rewards(n):
    """Why maxrl targets H_{N-1}: on binary rewards its one-liner equals, exactly, the harmonic
    mixture over k = 1..n-1 of the centered leave-one-out weights s^(loo,c) (spec 2.3), which is
    unbiased for sum_{k<n} (1/k) grad pass@k. (Not so for continuous rewards.)"""
    g = torch.Generator().manual_seed(n)
    r = (torch.rand(300, n, generator=g, dtype=torch.float64) > 0.6).to(torch.float64)
    a = bk.advantages(r, estimator="maxrl", backend="torch", scale="sum")
    b = bk.advantages(r, estimator="maxk_loo_centered", k_weights=bk.maxrl_weights(n - 1), backend="torch",
                      scale="sum")
    assert torch.allclose(a, b, rtol=0, atol=1e-14)
    rc = torch.rand(20, n, generator=g, dtype=torch.float64)
    a = bk.advantages(rc, estimator="maxrl", backend="torch", scale="sum")
    b = bk.advantages(rc, estimator="maxk_loo_centered", k_weights=bk.maxrl_weights(n - 1), backend="torch",
                      scale="sum")
    assert (a - b).abs().max() > 1e-3
