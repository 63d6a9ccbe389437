"""bk.prepare_advantages: a plan's call equals bk.advantages with checks off, on every estimator and
CPU backend, and every argument error is raised when the plan is made (values are the caller's)."""

from __future__ import annotations

import math

import pytest
import torch

import bonkernels as bk
from bonkernels import backends, estimators

CPU_BACKENDS = [b for b in ("torch", "cpu") if backends.ROWS[b].unavailable() is None]


def rewards_for(est, G, n, generator, dtype=torch.float32):
    if est.binary:
        return (torch.rand(G, n, generator=generator) < 0.5).to(dtype)
    return torch.rand(G, n, generator=generator).to(dtype)  # >= 0 (maxrl)


def plain_call(rewards, k, est, deltas, backend, **options):
    return bk.advantages(rewards, k, est.name, deltas=deltas, backend=backend, check_inputs=False,
                         max_group_size=rewards.shape[1], **options)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("est", [e for e in estimators._ENTRIES], ids=lambda e: e.name)
def test_plan_equals_advantages_with_checks_off(est, backend):
    if backend not in est.backends:
        pytest.skip(f"{est.name} does not run on {backend}")
    generator = torch.Generator().manual_seed(50 + est.code)
    k = 2 if est.uses_k else None
    for n, scale, clip in ((5, "mean", None), (16, "sum", (-0.3, 0.5)), (1, "mean", None)):
        options = dict(scale=scale, clip=clip, small_groups="zero",
                       clamp_delta=0.1 if est.needs_deltas else None)
        plan = bk.prepare_advantages(k, est.name, group_size=n, backend=backend, **options)
        assert plan.backend == backend and plan.group_size == n
        for G in (1, 7, 0):
            rewards = rewards_for(est, G, n, generator)
            deltas = (torch.rand(G, n, generator=generator) - 0.5) * 0.4 if est.needs_deltas else None
            got = plan(rewards, deltas)
            want = plain_call(rewards, k, est, deltas, backend, **options)
            assert got.shape == rewards.shape and got.dtype == rewards.dtype
            assert torch.equal(got, want), (est.name, backend, n, G, got, want)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_plan_with_k_weights_and_float64(backend):
    generator = torch.Generator().manual_seed(7)
    weights = bk.maxrl_weights(8)
    plan = bk.prepare_advantages(None, "maxk_loo1", group_size=8, k_weights=weights, backend=backend,
                                 dtype=torch.float64)
    rewards = torch.rand(5, 8, generator=generator, dtype=torch.float64)
    want = bk.advantages(rewards, None, "maxk_loo1", k_weights=weights, backend=backend)
    assert torch.equal(plan(rewards), want)


def test_plan_takes_any_strides_and_never_tracks_grad():
    generator = torch.Generator().manual_seed(8)
    plan = bk.prepare_advantages(3, "maxk", group_size=6, backend="cpu")
    wide = torch.rand(6, 10, generator=generator).T.contiguous().T[:, :6]  # not contiguous
    assert not wide.is_contiguous()
    assert torch.equal(plan(wide), bk.advantages(wide.contiguous(), 3, "maxk", backend="cpu"))
    leaf = torch.rand(4, 6, generator=generator, requires_grad=True)
    out = plan(leaf)
    assert not out.requires_grad and out.grad_fn is None


def test_argument_errors_come_when_the_plan_is_made():
    # the errors of bk.advantages itself, from its checked call on a probe group
    with pytest.raises(ValueError, match="groups of 8: maxk needs k <= n, but k = 9"):
        bk.prepare_advantages(9, "maxk", group_size=8)  # small_groups="error": k > n
    bk.prepare_advantages(9, "maxk", group_size=8, small_groups="zero")
    with pytest.raises(ValueError, match="clamp_delta must be a positive number"):
        bk.prepare_advantages(2, "maxk_offpolicy", group_size=8, clamp_delta=-1.0)
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        bk.prepare_advantages(2, "maxk", group_size=8, backend="gpu")
    with pytest.raises(ValueError, match="unknown estimator"):
        bk.prepare_advantages(2, "no_such_estimator", group_size=8)
    with pytest.raises(ValueError, match="a sum of reference calls"):
        bk.prepare_advantages(None, "maxk_offpolicy_exact", group_size=8, k_weights=[0.5, 0.5])
    for bad in (0, -3, 2.0, True, None):
        with pytest.raises(ValueError, match="group_size"):
            bk.prepare_advantages(2, "maxk", group_size=bad)


def test_call_errors_name_what_the_plan_takes():
    plan = bk.prepare_advantages(2, "maxk", group_size=8, backend="cpu")
    with pytest.raises(ValueError, match=r"\[G, 8\] rewards, got shape \(4, 7\)"):
        plan(torch.rand(4, 7))
    with pytest.raises(ValueError, match=r"\[G, 8\] rewards, got shape \(32,\)"):
        plan(torch.rand(32))
    with pytest.raises(ValueError, match="torch.float32 rewards on cpu, got torch.float64"):
        plan(torch.rand(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="takes no deltas"):
        plan(torch.rand(4, 8), torch.zeros(4, 8))
    off = bk.prepare_advantages(2, "maxk_offpolicy", group_size=8, clamp_delta=0.2, backend="cpu")
    with pytest.raises(ValueError, match="needs deltas"):
        off(torch.rand(4, 8))
    with pytest.raises(ValueError, match="deltas must be shaped like the rewards"):
        off(torch.rand(4, 8), torch.zeros(4, 9))
    assert "maxk_offpolicy" in repr(off) and "group_size=8" in repr(off)


def test_nan_rewards_follow_the_unchecked_contract():
    """No value checks in a call: a group with a NaN gives NaN (the native NaN contract), the
    others their values."""
    plan = bk.prepare_advantages(2, "maxk_loo1", group_size=4, backend="cpu")
    rewards = torch.tensor([[0.1, math.nan, 0.3, 0.2], [0.5, 0.1, 0.9, 0.4]])
    out = plan(rewards)
    assert torch.isnan(out[0]).all()
    assert torch.equal(out[1:], bk.advantages(rewards[1:], 2, "maxk_loo1", backend="cpu"))


@pytest.mark.skipif("cpu" not in CPU_BACKENDS, reason="the compiled extension is not built")
def test_torch_compile_fullgraph_traces_a_plan():
    plan = bk.prepare_advantages(4, "maxk_loo1", group_size=8, backend="cpu")
    rewards = torch.rand(6, 8, generator=torch.Generator().manual_seed(9))

    def step(r):
        a = plan(r)
        return (a * 2.0).sum(), a

    total, a = torch.compile(step, fullgraph=True, backend="aot_eager")(rewards)
    assert torch.equal(a, plan(rewards)) and torch.allclose(total, 2 * a.sum())


@pytest.mark.skipif("cpu" not in CPU_BACKENDS, reason="the compiled extension is not built")
def test_native_plans_enter_the_op_directly():
    """A native plan calls bonkernels._C.prepared_call (the op's C++ without torch's dispatcher):
    the op's values and its errors, as Python exceptions; the prepared arguments keep their bank
    alive."""
    import gc

    from bonkernels import _C, _native

    assert hasattr(_C, "prepared_call")
    rewards = torch.rand(9, 8, generator=torch.Generator().manual_seed(11))
    weights = bk.maxrl_weights(8)
    plan = bk.prepare_advantages(None, "maxk_loo1", group_size=8, k_weights=weights, backend="cpu")
    want = bk.advantages(rewards, None, "maxk_loo1", k_weights=weights, backend="cpu")
    bank = {name: tensor.clone() for name, tensor in plan._bank.items()}
    call = _native.prepare(*plan._args, **bank)
    del bank
    gc.collect()
    offsets = torch.arange(0, 73, 8)
    assert torch.equal(call(rewards, offsets, None), want)
    assert torch.equal(call(rewards.reshape(-1), offsets, None), want.reshape(-1))  # read flat

    prepared = _C.prepare(2, estimators.get("maxk").code, None, -math.inf, math.inf, True, 0, 1e-6, 8,
                          None, None)
    with pytest.raises(TypeError, match="values must be a tensor"):
        _C.prepared_call(prepared, [0.5] * 8, offsets[:2], None)
    with pytest.raises(TypeError, match="values must be float16/bfloat16/float32/float64"):
        _C.prepared_call(prepared, torch.zeros(8, dtype=torch.int64), offsets[:2], None)
    with pytest.raises(TypeError, match="offsets must be int64"):
        _C.prepared_call(prepared, torch.zeros(8), offsets[:2].int(), None)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        _C.prepared_call(prepared, torch.zeros(8), offsets[:2])
    with pytest.raises(ValueError):
        _C.prepared_call(object(), torch.zeros(8), offsets[:2], None)  # not a prepared capsule
    with pytest.raises(ValueError, match="unknown estimator code"):
        _C.prepared_call(_C.prepare(2, 999, None, 0.0, 1.0, True, 0, 1e-6, 8, None, None), torch.zeros(8),
                         offsets[:2], None)
