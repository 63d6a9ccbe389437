"""Argument rules of the public ops, beyond the per-backend contract of test_api_contract.py:
every kind of malformed ``clip`` / ``clamp_delta`` / ``k`` / ``eps``, real numbers of any Python
or numpy type accepted, unsupported devices named by every entry point (the policy loss and the
objective too), and k of any size in the metrics.
"""

from __future__ import annotations

import math

import pytest
import torch

import bonkernels as bk

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


@pytest.mark.parametrize("G, n", [(0, 4), (1, 1), (3, 0), (5, 7)])
def test_full_layout_offsets_are_kept_per_shape(G, n):
    from bonkernels import groups
    first = groups.full_offsets(G, n, torch.device("cpu"))
    assert first.tolist() == [g * n for g in range(G + 1)] and first.dtype == torch.int64
    assert groups.full_offsets(G, n, torch.device("cpu")) is first   # the next call of the shape reuses it
    # and a [G, n] call still gives the row-by-row result
    if G and n:
        r = torch.rand(G, n, dtype=torch.float64)
        want = torch.cat([bk.advantages(r[g:g + 1], 1, "maxk_loo1", backend="torch") for g in range(G)])
        torch.testing.assert_close(bk.advantages(r, 1, "maxk_loo1", backend="torch"), want)
