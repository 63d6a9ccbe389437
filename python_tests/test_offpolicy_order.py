"""Off-policy max@k (spec 3.2, 3.4, 10 Part C): samples from pi_old, gradient wanted at
theta = theta_old + eps * u, deltas = pi_theta/pi_old - 1 per sample.

Exact expectations over all multisets of n draws from pi_old. The first-order (Bagirov) weights
must have an O(eps^2) bias, the on-policy weights on stale samples an O(eps) bias, and the exact
product-of-ratios weights none.
"""

import numpy as np
import pytest
import torch

import bonkernels as bk

try:
    from .oracle import grad_expected_max, multisets, policy
except ImportError:
    from oracle import grad_expected_max, multisets, policy

THETA_OLD = np.array([0.3, -0.2, 0.5, -0.4, 0.1])
U = np.array([1.0, -2.0, 0.5, 1.5, -1.0])
U = U / np.linalg.norm(U)
EPSILONS = (0.2, 0.1, 0.05, 0.025)
CONTINUOUS = (0.0, 0.3, 0.3, 0.8, 1.0)
BINARY = (0.0, 1.0, 0.0, 0.0, 1.0)


def relative_error(name, rewards, n, k, eps, clamp_delta=None):
    """|E_old[sum_i A_i grad log pi_theta(x_i)] - grad max@k(theta)| / |grad max@k(theta)|."""
    theta = THETA_OLD + eps * U
    pi_old, pi = policy(THETA_OLD), policy(theta)
    draws, probs = multisets(n, THETA_OLD)
    g = torch.tensor(np.asarray(rewards)[draws], dtype=torch.float64)
    kw = {}
    if name != "maxk":  # the on-policy formula ignores the ratios altogether
        kw["deltas"] = torch.tensor((pi / pi_old)[draws] - 1.0, dtype=torch.float64)
        kw["clamp_delta"] = clamp_delta
    A = bk.advantages(g, k, name, scale="sum", backend="torch", **kw).numpy()
    score = np.eye(len(pi))[draws] - pi  # grad log pi_theta(x), at theta
    got = np.einsum("m,mi,mij->j", probs, A, score)
    target = grad_expected_max(theta, rewards, k)
    return np.linalg.norm(got - target) / np.linalg.norm(target)


def fitted_order(errors):
    """Least-squares slope of log(error) against log(eps)."""
    return float(np.polyfit(np.log(EPSILONS), np.log(errors), 1)[0])


CASES = [(CONTINUOUS, 6, 3), (CONTINUOUS, 6, 2), (CONTINUOUS, 5, 4), (BINARY, 6, 3)]


@pytest.mark.parametrize("rewards,n,k", CASES)
def test_first_order_bias_is_second_order(rewards, n, k):
    errors = [relative_error("maxk_offpolicy", rewards, n, k, eps) for eps in EPSILONS]
    order = fitted_order(errors)
    assert 1.7 <= order <= 2.3, f"n={n} k={k}: errors {errors}, fitted order {order:.2f}"
    assert errors[-1] < 1e-2


@pytest.mark.parametrize("rewards,n,k", CASES)
def test_on_policy_weights_on_stale_samples_are_first_order(rewards, n, k):
    errors = [relative_error("maxk", rewards, n, k, eps) for eps in EPSILONS]
    order = fitted_order(errors)
    assert 0.7 <= order <= 1.3, f"n={n} k={k}: errors {errors}, fitted order {order:.2f}"
    # and the first-order correction is much better at every eps
    first = [relative_error("maxk_offpolicy", rewards, n, k, eps) for eps in EPSILONS]
    assert all(f < 0.2 * e for f, e in zip(first, errors)), (first, errors)


@pytest.mark.parametrize("rewards,n,k", CASES + [(CONTINUOUS, 4, 1), (CONTINUOUS, 4, 4)])
def test_exact_weights_are_unbiased(rewards, n, k):
    for eps in EPSILONS:
        err = relative_error("maxk_offpolicy_exact", rewards, n, k, eps)
        assert err < 1e-10, f"n={n} k={k} eps={eps}: relative error {err:.2e}"


def test_first_order_is_exact_at_k_1():
    """k = 1: (1 + delta_i) g_i / n is the exact importance-weighted estimator."""
    for eps in EPSILONS:
        assert relative_error("maxk_offpolicy", CONTINUOUS, 4, 1, eps) < 1e-10


def test_clamping_trades_bias_for_robustness():
    """spec 3.2: clamp_delta = 0.05 raises the error at eps = 0.2; a clamp above every |delta|
    changes nothing."""
    free = relative_error("maxk_offpolicy", CONTINUOUS, 6, 3, 0.2)
    assert relative_error("maxk_offpolicy", CONTINUOUS, 6, 3, 0.2, clamp_delta=50.0) == pytest.approx(
        free, rel=1e-12)
    clamped = relative_error("maxk_offpolicy", CONTINUOUS, 6, 3, 0.2, clamp_delta=0.05)
    assert clamped > 3 * free, (clamped, free)
