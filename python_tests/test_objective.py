"""bonkernels.objective.maxk_objective: J(rho) of spec 3.4 and its gradient, against subset enumeration."""

import itertools
import math

import pytest
import torch

import bonkernels as bk
from bonkernels.objective import maxk_objective


def brute_J(g, lr, k):
    """(1/C(n,k)) sum over k-subsets of prod(rho) * max(g), in plain Python floats."""
    n = len(g)
    rho = [math.exp(x) for x in lr]
    total = 0.0
    for I in itertools.combinations(range(n), k):
        total += math.prod(rho[i] for i in I) * max(g[i] for i in I)
    return total / math.comb(n, k)


def brute_exact_weights(g, lr, k):
    """A^exact_i = (1/C(n,k)) sum_{I containing i} prod(rho) max(g) (spec 3.2, exact form)."""
    n = len(g)
    rho = [math.exp(x) for x in lr]
    A = [0.0] * n
    for I in itertools.combinations(range(n), k):
        v = math.prod(rho[i] for i in I) * max(g[i] for i in I)
        for i in I:
            A[i] += v
    return [a / math.comb(n, k) for a in A]


def _group(n, seed, ties=False, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(n, generator=gen, dtype=torch.float64)
    if ties:
        g = (g * 3).floor() / 3
    lr = scale * torch.randn(n, generator=gen, dtype=torch.float64)
    return g, lr


@pytest.mark.parametrize("n", [1, 2, 4, 7])
@pytest.mark.parametrize("ties", [False, True])
def test_forward_and_gradient_match_enumeration(n, ties):
    for k in range(1, n + 1):
        g, lr = _group(n, seed=10 * n + k, ties=ties)
        x = lr.clone().requires_grad_()
        J = maxk_objective(g[None], x[None], k)
        assert J.shape == (1,)
        assert J.item() == pytest.approx(brute_J(g.tolist(), lr.tolist(), k), rel=1e-12, abs=1e-14)
        J.sum().backward()
        expect = torch.tensor(brute_exact_weights(g.tolist(), lr.tolist(), k), dtype=torch.float64)
        torch.testing.assert_close(x.grad, expect, rtol=1e-11, atol=1e-13)


def test_gradcheck_exact_ragged_groups():
    offsets = torch.tensor([0, 3, 9, 12, 16])   # sizes 3, 6, 3, 4
    gen = torch.Generator().manual_seed(3)
    g = torch.rand(16, generator=gen, dtype=torch.float64)
    lr = (0.4 * torch.randn(16, generator=gen, dtype=torch.float64)).requires_grad_()
    for k in (1, 2, 3):
        assert torch.autograd.gradcheck(lambda x: maxk_objective(g, x, k, offsets=offsets), (lr,))


def test_gradcheck_padded_and_group_ids_layouts():
    gen = torch.Generator().manual_seed(4)
    g = torch.rand(3, 6, generator=gen, dtype=torch.float64)
    lr = (0.3 * torch.randn(3, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    lengths = torch.tensor([6, 4, 2])
    assert torch.autograd.gradcheck(lambda x: maxk_objective(g, x, 2, lengths=lengths), (lr,))
    ids = torch.tensor([5, 1, 5, 1, 9, 5, 1, 9])
    g1 = torch.rand(8, generator=gen, dtype=torch.float64)
    lr1 = (0.3 * torch.randn(8, generator=gen, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: maxk_objective(g1, x, 2, group_ids=ids), (lr1,))
    # group order is ascending id: 1, 5, 9
    J = maxk_objective(g1, lr1.detach(), 2, group_ids=ids)
    for j, gid in enumerate((1, 5, 9)):
        sel = ids == gid
        assert J[j].item() == pytest.approx(brute_J(g1[sel].tolist(), lr1.detach()[sel].tolist(), 2), rel=1e-12)


def test_on_policy_value_is_max_at_k_and_gradient_is_s():
    """At logratio = 0, J = the unbiased max@k and its gradient = the on-policy weights s_i."""
    gen = torch.Generator().manual_seed(5)
    g = torch.rand(4, 8, generator=gen, dtype=torch.float64)
    x = torch.zeros_like(g, requires_grad=True)
    J = maxk_objective(g, x, 3)
    torch.testing.assert_close(J.detach(), bk.max_at_k(g, 3))
    J.sum().backward()
    torch.testing.assert_close(x.grad, bk.advantages(g, 3, "maxk", scale="sum"))


def test_first_order_version_is_second_order_close():
    """exact=False: forward and backward differ from the exact ones by O(delta^2)."""
    gen = torch.Generator().manual_seed(6)
    g = torch.rand(3, 6, generator=gen, dtype=torch.float64)
    u = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    errors = []
    for eps in (0.1, 0.05, 0.025):
        out = {}
        for exact in (True, False):
            x = (eps * u).clone().requires_grad_()
            J = maxk_objective(g, x, 3, exact=exact)
            J.sum().backward()
            out[exact] = (J.detach(), x.grad)
        errors.append(((out[True][0] - out[False][0]).abs().max().item(),
                       (out[True][1] - out[False][1]).abs().max().item()))
        # the first-order weights are Bagirov's, from bk.advantages
        deltas = torch.expm1(eps * u)
        torch.testing.assert_close(out[False][1], bk.advantages(g, 3, "maxk_offpolicy", deltas=deltas, scale="sum"))
    for (v0, g0), (v1, g1) in zip(errors, errors[1:]):
        assert 3.0 < v0 / v1 < 5.0      # halving delta quarters the error
        assert 3.0 < g0 / g1 < 5.0


def test_dtype_and_no_grad_for_rewards():
    g = torch.rand(2, 4, dtype=torch.float64)
    x = torch.zeros(2, 4, dtype=torch.float32, requires_grad=True)
    J = maxk_objective(g, x, 2)
    assert J.dtype == torch.float32
    J.sum().backward()
    assert x.grad.dtype == torch.float32


def test_bad_input():
    g = torch.rand(2, 4, dtype=torch.float64)
    x = torch.zeros(2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="shape"):
        maxk_objective(g, x[:, :3], 2)
    with pytest.raises(ValueError, match="k = 5"):
        maxk_objective(g, x, 5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        maxk_objective(g, x, 0)
    with pytest.raises(TypeError, match="k must be"):
        maxk_objective(g, x, 2.0)
    bad = x.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="logratio must be finite"):
        maxk_objective(g, bad, 2)
    badg = g.clone()
    badg[1, 1] = float("inf")
    with pytest.raises(ValueError, match="rewards must be finite"):
        maxk_objective(badg, x, 2)
    with pytest.raises(TypeError, match="floating-point"):
        maxk_objective(g, torch.zeros(2, 4, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="k = 2"):
        maxk_objective(g.reshape(-1), x.reshape(-1), 2, offsets=torch.tensor([0, 1, 8]))
