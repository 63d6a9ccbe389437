"""The same input rules on every backend CI can run (torch, cpu, Triton under the interpreter).

* Constant groups give exactly 0 from every estimator that centres or z-scores, for every eps
  (0 included) and dtype; float64 grpo at the edge of the range gives the finite true values.
* Rewards that require grad are read as constants: same values, no gradient, no warning.
* Argument types: ``clip`` a pair of real numbers, ``clamp_delta`` a real number, ``k`` an int.
* Any k >= 1 (beyond 2^31 too) with small_groups "clamp" / "zero"; estimators that ignore k
  accept any k.
* Unsupported devices (``meta``) get an error naming the device.

The Triton cases run in a subprocess with TRITON_INTERPRET=1 (set before triton is imported).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import bonkernels as bk
from bonkernels import _native, estimators

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CENTRED = ("grpo", "rloo", "dr_grpo", "bon_mean", "maxrl", "bon_max_mean")


def check_constant_groups_are_exactly_zero(backend):
    for dtype in DTYPES:
        for value in (0.5402, 0.1, 3.0, 1e-30 if dtype == torch.float64 else 0.25):
            rewards = torch.full((3, 16), value, dtype=torch.float64).to(dtype)
            for name in CENTRED:
                k = 2 if estimators.get(name).uses_k else None
                for eps in (0.0, 1e-6):
                    kw = {"eps": eps} if name in ("grpo", "bon_mean") else {}
                    got = bk.advantages(rewards, k, name, backend=backend, **kw)
                    assert torch.equal(got, torch.zeros_like(got)), (name, dtype, value, eps, got[0, :4])
    for value in (0.0, 1.0):                 # chen_passk on all-fail / all-pass groups
        rewards = torch.full((2, 8), value)
        for name in ("chen_passk",):
            for eps in (0.0, 1e-6):
                kw = {"eps": eps} if name == "chen_passk" else {}
                got = bk.advantages(rewards, 3, name, backend=backend, **kw)
                assert torch.equal(got, torch.zeros_like(got)), (name, value, eps, got)


def check_extreme_float64_grpo(backend):
    rewards = torch.tensor([[1.7e308, -1.7e308, 0.0, 1.0]], dtype=torch.float64)
    got = bk.advantages(rewards, None, "grpo", backend=backend, eps=0.0)
    # z-scores of (a, -a, 0, 1) with a = 1.7e308: mean and std scale with a, so the values are those
    # of (1, -1, 0, 1/a) up to rounding: mean ~ 0, sample std ~ sqrt(2/3) * a
    x = torch.tensor([1.0, -1.0, 0.0, 1.0 / 1.7e308], dtype=torch.float64)
    want = (x - x.mean()) / x.std()
    assert torch.isfinite(got).all(), got
    torch.testing.assert_close(got[0], want, rtol=1e-12, atol=1e-300)


def check_rewards_requiring_grad_are_constants(backend):
    base = torch.rand(4, 8, dtype=torch.float64)
    leaf = base.clone().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # (the interpreter's numpy RuntimeWarnings aside)
        got = bk.advantages(leaf * 1.0, 3, "maxk_loo1", backend=backend)
    assert not got.requires_grad and got.grad_fn is None
    torch.testing.assert_close(got, bk.advantages(base, 3, "maxk_loo1", backend="torch"), rtol=1e-12, atol=1e-12)
    deltas = (torch.rand(4, 8, dtype=torch.float64) * 0.2).requires_grad_(True)
    got = bk.advantages(base, 3, "maxk_offpolicy", deltas=deltas, backend=backend)
    assert not got.requires_grad


def check_any_k(backend):
    rewards = torch.rand(5, 6, dtype=torch.float64)
    for big in (2 ** 31, 2 ** 40, 10 ** 30):
        for name in ("maxk", "maxk_loo1", "maxk_loo", "passk"):
            r = (rewards > 0.5).double() if estimators.get(name).binary else rewards
            limit = 6 - estimators.get(name).k_margin
            clamped = bk.advantages(r, big, name, small_groups="clamp", backend=backend)
            torch.testing.assert_close(clamped, bk.advantages(r, limit, name, backend="torch"), rtol=1e-12, atol=1e-12)
            zeroed = bk.advantages(r, big, name, small_groups="zero", backend=backend)
            assert torch.equal(zeroed, torch.zeros_like(zeroed))
        for name in ("tang_loo", "bon_max_mean", "bon_max_second", "grpo", "rloo", "maxrl"):
            got = bk.advantages(rewards, big, name, backend=backend)
            torch.testing.assert_close(got, bk.advantages(rewards, None, name, backend="torch"), rtol=1e-12, atol=1e-12)


BACKEND_CHECKS = ("check_constant_groups_are_exactly_zero", "check_extreme_float64_grpo",
                  "check_rewards_requiring_grad_are_constants", "check_any_k")
needs_native = pytest.mark.skipif(not _native.available(), reason="native extension not built")


@pytest.mark.parametrize("check", BACKEND_CHECKS)
def test_torch_backend(check):
    globals()[check]("torch")


@needs_native
@pytest.mark.parametrize("check", BACKEND_CHECKS)
def test_cpu_backend(check):
    globals()[check]("cpu")


_INTERPRETER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_input_rules as t
    for name in t.BACKEND_CHECKS:
        getattr(t, name)("triton")
        print("ok", name, flush=True)
""")


def test_triton_backend_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT.format(tests=tests)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("ok ") == len(BACKEND_CHECKS)


# ----------------------------------------------------------------------------- argument types

@pytest.mark.parametrize("clip", ["12", b"12", (1, "2"), (True, 2), (1.0,), (1, 2, 3), 5.0, [None, 1.0]])
def test_clip_must_be_a_pair_of_real_numbers(clip):
    with pytest.raises(ValueError, match="clip must be a \\(lo, hi\\) pair of numbers"):
        bk.advantages(torch.rand(2, 4), 2, clip=clip)


def test_clip_accepts_real_numbers_of_any_kind():
    import numpy as np
    r = torch.rand(2, 4, dtype=torch.float64)
    want = bk.advantages(r, 2, clip=(-0.1, 0.1))
    for clip in ([-0.1, 0.1], (np.float64(-0.1), np.float32(0.1).item()), (-0.1, 0.1)):
        torch.testing.assert_close(bk.advantages(r, 2, clip=clip), want)


@pytest.mark.parametrize("clamp_delta", [True, "0.2", 0, -1.0, math.nan, (0.2,)])
def test_clamp_delta_must_be_a_positive_real_number(clamp_delta):
    r = torch.rand(2, 4)
    with pytest.raises(ValueError, match="clamp_delta must be a positive number"):
        bk.advantages(r, 2, "maxk_offpolicy", deltas=torch.zeros_like(r), clamp_delta=clamp_delta)


@pytest.mark.parametrize("k", [True, False, 2.0, "2", None])
def test_k_must_be_an_int(k):
    with pytest.raises(TypeError, match="k"):
        bk.advantages(torch.rand(2, 4), k, "maxk")
    if k is not None:
        with pytest.raises(TypeError, match="k must be a Python int"):
            bk.pass_at_k(torch.ones(2, 4), k)


def test_k_may_be_a_numpy_integer():
    import numpy as np
    r = torch.rand(2, 4, dtype=torch.float64)
    torch.testing.assert_close(bk.advantages(r, np.int64(2), "maxk"), bk.advantages(r, 2, "maxk"))


@pytest.mark.parametrize("eps", [True, "1e-6", -1.0, math.inf])
def test_eps_must_be_a_finite_non_negative_number(eps):
    with pytest.raises(ValueError, match="eps must be a finite number"):
        bk.advantages(torch.rand(2, 4), None, "grpo", eps=eps)


def test_unsupported_devices_are_named():
    meta = torch.rand(2, 4, device="meta")
    with pytest.raises(ValueError, match="'meta' device"):
        bk.advantages(meta, 2)
    with pytest.raises(ValueError, match="'meta' device"):
        bk.pass_at_k(torch.ones(2, 4, device="meta"), 2)
    with pytest.raises(ValueError, match="'meta' device"):
        bk.max_at_k(meta, 2)
    with pytest.raises(ValueError, match="'meta' device"):
        bk.maxk_objective(meta, torch.zeros(2, 4, device="meta"), 2)
    with pytest.raises(ValueError, match="'meta' device"):
        bk.policy_loss(torch.zeros(4, 3, device="meta"), torch.zeros(4, 3, device="meta"),
                       torch.zeros(4, device="meta"), 2, group_size=2)


def test_big_k_for_the_metrics():
    correct = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert float(bk.pass_at_k(correct, 10 ** 30, small_groups="clamp")[0]) == 1.0
    assert float(bk.max_at_k(correct, 2 ** 40, small_groups="zero")[0]) == 0.0
