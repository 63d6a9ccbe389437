"""Exact expectations on a tiny 5-outcome softmax policy (spec 10 Part B).

A group is n i.i.d. draws from pi = softmax(theta). Enumerating every multiset of n draws with its
multinomial probability gives the estimator's exact expected gradient
E[sum_i A_i grad log pi(x_i)] (sum scale), which must equal grad E[max of k draws] for every
estimator the spec calls unbiased, and must be measurably off for the ones it calls biased.
"""

import itertools
import math

import numpy as np
import pytest
import torch

import bonkernels as bk
from bonkernels import estimators as registry

try:
    from .oracle import expected_max, grad_expected_max, multisets, policy
except ImportError:
    from oracle import expected_max, grad_expected_max, multisets, policy

THETA = np.array([0.3, -0.2, 0.5, -0.4, 0.1])
THETA_2 = np.array([-0.5, 0.4, 0.0, 0.6, -0.3])  # a second policy, for scale-only biases
CONTINUOUS = (0.0, 0.3, 0.3, 0.8, 1.0)  # ties between outcomes 1 and 2
BINARY = (0.0, 1.0, 0.0, 0.0, 1.0)
REWARDS = {"continuous": CONTINUOUS, "binary": BINARY}
NS = (4, 6)


def expected_gradient(name, rewards, theta, n, k, scale="sum"):
    """E[sum_i A_i grad log pi(x_i)], exactly, with A from one batched bk.advantages call."""
    draws, probs = multisets(n, theta)
    pi = policy(theta)
    g = torch.tensor(np.asarray(rewards)[draws], dtype=torch.float64)
    kw = {}
    if registry.get(name).needs_deltas:
        kw["deltas"] = torch.zeros_like(g)  # on-policy: pi_theta = pi_old
    A = bk.advantages(g, k, name, scale=scale, backend="torch", **kw).numpy()
    score = np.eye(len(pi))[draws] - pi  # grad log pi(x) = e_x - pi, shape [M, n, 5]
    return np.einsum("m,mi,mij->j", probs, A, score)


def k_values(n):
    return sorted({1, 2, 3, n - 1, n})


# --------------------------------------------------------------------------------------------
# The harness itself
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rewards", [CONTINUOUS, BINARY])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 6])
def test_target_gradient_matches_finite_differences(rewards, k):
    h = 1e-5
    for theta in (THETA, THETA_2):
        fd = np.array([(expected_max(theta + h * e, rewards, k) - expected_max(theta - h * e, rewards, k))
                       / (2 * h) for e in np.eye(len(theta))])
        np.testing.assert_allclose(grad_expected_max(theta, rewards, k), fd, rtol=0, atol=1e-9)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_expected_max_matches_multiset_enumeration(k):
    draws, probs = multisets(k, THETA)
    brute = float(np.dot(probs, np.asarray(CONTINUOUS)[draws].max(axis=1)))
    assert math.isclose(brute, expected_max(THETA, CONTINUOUS, k), rel_tol=1e-13)
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-13)


@pytest.mark.parametrize("name", ["maxk_loo1", "bon_max_second"])
def test_multiset_harness_matches_ordered_tuples(name):
    """The multiset expectation equals the plain one over all 5^n ordered draws."""
    n, k = 4, 2
    pi = policy(THETA)
    tuples = np.array(list(itertools.product(range(len(pi)), repeat=n)))
    probs = np.prod(pi[tuples], axis=1)
    g = torch.tensor(np.asarray(CONTINUOUS)[tuples], dtype=torch.float64)
    A = bk.advantages(g, k, name, scale="sum", backend="torch").numpy()
    brute = np.einsum("m,mi,mij->j", probs, A, np.eye(len(pi))[tuples] - pi)
    np.testing.assert_allclose(expected_gradient(name, CONTINUOUS, THETA, n, k), brute,
                               rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------------------------
# Unbiased estimators: exact equality with the target
# --------------------------------------------------------------------------------------------

def unbiased_cases():
    """(estimator, reward kind, n, k passed, k of the target max@k, factor) for every case; the
    factor is what the sum-scale expectation is of the target (1 = unbiased)."""
    cases = []
    for n in NS:
        for k in k_values(n):
            for kind in REWARDS:
                cases.append(("maxk", kind, n, k, k, 1.0))
                cases.append(("maxk_loo1", kind, n, k, k, 1.0))
                cases.append(("maxk_offpolicy_exact", kind, n, k, k, 1.0))  # deltas = 0
                cases.append(("maxk_offpolicy", kind, n, k, k, 1.0))  # deltas = 0: exactly s
                if k <= n - 1:
                    cases.append(("maxk_loo", kind, n, k, k, 1.0))
                    cases.append(("maxk_loo_centered", kind, n, k, k, 1.0))
            cases.append(("passk", "binary", n, k, k, 1.0))
        for kind in REWARDS:
            cases.append(("tang_loo", kind, n, 1, n, 1.0))  # k is ignored; targets max@n
            cases.append(("rloo", kind, n, 1, 1, 1.0))  # sum scale: (g_i - mean_{-i})/n
            cases.append(("dr_grpo", kind, n, 1, 1, (n - 1) / n))  # self in the mean: (n-1)/n
        cases.append(("bon_rlb_pos", "binary", n, 1, 1, 1.0))  # spec 4: N = 1 stays exact
    return cases


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("kind", list(REWARDS))
def test_rloo_in_its_natural_mean_scale_is_n_times_grad_mean_reward(n, kind):
    """rloo's own (mean) scale: g_i - mean of the others, E[sum_i A_i grad log pi] = n grad E[g]."""
    rewards = REWARDS[kind]
    for theta in (THETA, THETA_2):
        got = expected_gradient("rloo", rewards, theta, n, 1, scale="mean")
        np.testing.assert_allclose(got, n * grad_expected_max(theta, rewards, 1), rtol=1e-12, atol=1e-15)


def test_every_estimator_the_registry_calls_unbiased_is_checked():
    checked = {c[0] for c in unbiased_cases()}
    assert {e for e in bk.ESTIMATORS if registry.get(e).unbiased} <= checked


@pytest.mark.parametrize("name,kind,n,k,target_k,factor", unbiased_cases(),
                         ids=lambda v: str(v))
def test_unbiased_for_grad_max_at_k(name, kind, n, k, target_k, factor):
    rewards = REWARDS[kind]
    for theta in (THETA, THETA_2):
        target = factor * grad_expected_max(theta, rewards, target_k)
        got = expected_gradient(name, rewards, theta, n, k)
        err = np.linalg.norm(got - target) / np.linalg.norm(target)
        assert err < 1e-12, f"{name} n={n} k={k} {kind}: relative error {err:.3e}\n{got}\n{target}"


# --------------------------------------------------------------------------------------------
# Biased estimators: measurably off (direction, or a policy-dependent scale)
# --------------------------------------------------------------------------------------------

def biased_cases():
    cases = []
    for n in NS:
        cases.append(("bon_max_mean", "continuous", n, 1, n))
        cases.append(("bon_max_second", "continuous", n, 1, n))  # ties at the top in many draws
        cases.append(("grpo", "continuous", n, 1, 1))
        cases.append(("grpo", "binary", n, 1, 1))
        for k in (2, 3, n - 1):
            cases.append(("bon_mean", "continuous", n, k, k))
        for k in range(2, n - 1):  # k = n - 1: a fixed multiple, see the test below
            cases.append(("chen_passk", "binary", n, k, k))
        for k in (2, 3, n - 1, n):
            cases.append(("bon_rlb", "binary", n, k, k))
            cases.append(("bon_rlb_pos", "binary", n, k, k))
        cases.append(("bon_rlb", "binary", n, 1, 1))
    return cases


def bias_measure(name, kind, n, k, target_k):
    """Scale-free bias: the larger of 1 - cos(E, target) and the relative change between two
    policies of E's projection on the target (an estimator unbiased up to a fixed constant has
    both 0). Binary-reward estimators are always parallel to grad pass@k, so only the second
    one can show their bias."""
    rewards = REWARDS[kind]
    ratios, cos_err = [], 0.0
    for theta in (THETA, THETA_2):
        target = grad_expected_max(theta, rewards, target_k)
        got = expected_gradient(name, rewards, theta, n, k)
        cos = got @ target / (np.linalg.norm(got) * np.linalg.norm(target))
        cos_err = max(cos_err, 1 - cos)
        ratios.append(got @ target / (target @ target))
    return max(cos_err, abs(ratios[0] / ratios[1] - 1)), ratios


@pytest.mark.parametrize("name,kind,n,k,target_k", biased_cases(), ids=lambda v: str(v))
def test_biased_estimators_are_measurably_biased(name, kind, n, k, target_k):
    bias, ratios = bias_measure(name, kind, n, k, target_k)
    assert bias > 1e-3, f"{name} n={n} k={k} {kind}: bias {bias:.2e}, scale ratios {ratios}"


@pytest.mark.parametrize("n", NS)
def test_bon_max_second_is_tang_when_the_top_cannot_tie(n):
    """The top often ties on the toy (repeated draws), so compare per multiset: bon_max_second
    (mean scale) equals tang_loo (sum scale) on the multisets whose maximum is unique, and
    differs on the others."""
    draws, _ = multisets(n, THETA)
    g = np.asarray(CONTINUOUS)[draws]
    unique_top = (g == g.max(axis=1, keepdims=True)).sum(axis=1) == 1
    gt = torch.tensor(g, dtype=torch.float64)
    second = bk.advantages(gt, 1, "bon_max_second", scale="mean", backend="torch").numpy()
    tang = bk.advantages(gt, 1, "tang_loo", scale="sum", backend="torch").numpy()
    assert unique_top.any() and (~unique_top).any()
    np.testing.assert_allclose(second[unique_top], tang[unique_top], rtol=1e-14, atol=1e-15)
    assert not np.allclose(second[~unique_top], tang[~unique_top])


@pytest.mark.parametrize("n", NS)
def test_chen_at_k_n_minus_1_is_a_fixed_multiple_of_grad_pass_at_k(n):
    """At k = n - 1 Chen's advantage is nonzero only for c = 1, where it is a constant A+ on the
    correct sample and is centered; then E[sum A grad log pi] = A+ n (1-q)^(n-2) grad q, i.e.
    (sum scale) A+/(n-1) times grad pass@(n-1) for every policy: a policy-independent scale."""
    k, eps = n - 1, 1e-6
    R = 1 - 1 / n
    a_plus = (1 - R) / (math.sqrt(R * (1 - R)) + eps)
    for theta in (THETA, THETA_2):
        got = expected_gradient("chen_passk", BINARY, theta, n, k)
        np.testing.assert_allclose(got, a_plus / (n - 1) * grad_expected_max(theta, BINARY, k),
                                   rtol=1e-12, atol=1e-15)
