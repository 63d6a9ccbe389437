"""bonkernels.integrations.verl against the real verl package (skipped when verl is absent)."""

import uuid

import numpy as np
import pytest
import torch

import bonkernels as bk

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.trainer.config import AlgoConfig  # noqa: E402

from bonkernels.integrations import verl as bk_verl  # noqa: E402


def _batch(sizes, T=7, seed=0, binary=False, shuffle=True):
    """verl-style inputs: outcome reward on the last valid token, uuid-string group ids."""
    gen = torch.Generator().manual_seed(seed)
    bs = sum(sizes)
    uids = np.array([u for n in sizes for u in [str(uuid.UUID(int=int(torch.randint(0, 2**62, (1,), generator=gen))))] * n],
                    dtype=object)
    if shuffle:
        perm = torch.randperm(bs, generator=gen).numpy()
        uids = uids[perm]
    lengths = torch.randint(1, T + 1, (bs,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    scores = (torch.rand(bs, generator=gen) > 0.5).float() if binary else torch.rand(bs, generator=gen)
    rewards = torch.zeros(bs, T)
    rewards[torch.arange(bs), lengths - 1] = scores
    return rewards, mask, uids


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("binary", [False, True])
def test_grpo_reproduces_verl_grpo(norm, binary):
    rewards, mask, uids = _batch([4, 2, 5, 8, 3], seed=1 + binary, binary=binary)
    expect, expect_ret = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids,
                                                                   norm_adv_by_std_in_grpo=norm)
    fn = core_algos.get_adv_estimator_fn("bk_grpo")
    got, got_ret = fn(token_level_rewards=rewards, response_mask=mask, index=uids,
                      config=AlgoConfig(adv_estimator="bk_grpo", norm_adv_by_std_in_grpo=norm))
    assert got.shape == expect.shape and got.dtype == expect.dtype
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_ret, expect_ret, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("binary", [False, True])
def test_tang_loo_reproduces_verl_grpo_passk(norm, binary):
    rewards, mask, uids = _batch([4, 2, 5, 8, 3, 6], seed=3 + binary, binary=binary)
    cfg = AlgoConfig(adv_estimator="grpo_passk", norm_adv_by_std_in_grpo=norm)
    expect, _ = core_algos.compute_grpo_passk_outcome_advantage(rewards, mask, uids, config=cfg)
    got, _ = bk_verl.compute_advantage(rewards, mask, uids, estimator="tang_loo", scale="sum",
                                       norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)
    if binary:
        assert (got != 0).any()    # some group has a single correct sample


def test_registered_estimators_match_bonkernels():
    for name in bk.ESTIMATORS:
        if name.startswith("maxk_offpolicy"):
            with pytest.raises(ValueError):
                core_algos.get_adv_estimator_fn("bk_" + name)
            continue
        assert core_algos.get_adv_estimator_fn("bk_" + name).estimator == name
    rewards, mask, uids = _batch([4, 4, 4], seed=5, binary=True)
    bk_verl.configure(k=3)
    try:
        got, ret = core_algos.get_adv_estimator_fn("bk_maxk_loo1")(rewards, mask, uids, config=AlgoConfig())
    finally:
        bk_verl._SETTINGS["k"] = None
    _, inverse = np.unique(uids, return_inverse=True)
    expect = bk.advantages(rewards.sum(-1), 3, "maxk_loo1", group_ids=torch.as_tensor(inverse))
    torch.testing.assert_close(got, expect[:, None] * mask)
    torch.testing.assert_close(ret, got)
    # k from a dict-like config wins; scale too
    got_sum, _ = core_algos.get_adv_estimator_fn("bk_maxk")(rewards, mask, uids,
                                                             config={"bk_k": 2, "bk_scale": "sum"})
    expect = bk.advantages(rewards.sum(-1), 2, "maxk", group_ids=torch.as_tensor(inverse), scale="sum")
    torch.testing.assert_close(got_sum, expect[:, None] * mask)


def test_k_from_environment(monkeypatch):
    rewards, mask, uids = _batch([5, 5], seed=6)
    monkeypatch.setenv("BONKERNELS_K", "2")
    got, _ = core_algos.get_adv_estimator_fn("bk_maxk_loo_centered")(rewards, mask, uids, config=None)
    _, inverse = np.unique(uids, return_inverse=True)
    expect = bk.advantages(rewards.sum(-1), 2, "maxk_loo_centered", group_ids=torch.as_tensor(inverse))
    torch.testing.assert_close(got, expect[:, None] * mask)


def test_errors():
    rewards, mask, uids = _batch([4, 4], seed=7)
    with pytest.raises(ValueError, match="needs k"):
        bk_verl.compute_advantage(rewards, mask, uids, estimator="maxk_loo1")
    with pytest.raises(ValueError, match="current policy"):
        bk_verl.compute_advantage(rewards, mask, uids, estimator="maxk_offpolicy", k=2)
    with pytest.raises(ValueError, match="response_mask"):
        bk_verl.compute_advantage(rewards, mask[:, :3], uids, estimator="grpo")
    with pytest.raises(ValueError, match="index"):
        bk_verl.compute_advantage(rewards, mask, uids[:5], estimator="grpo")
    with pytest.raises(ValueError, match="k = 5"):
        bk_verl.compute_advantage(rewards, mask, uids, estimator="maxk", k=5)


def test_singleton_group_documented_difference():
    """A group of one sample: bonkernels gives 0, verl's GRPO gives the raw score / (1 + eps)."""
    rewards, mask, uids = _batch([4, 1, 3], seed=8, shuffle=False)
    expect, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uids)
    got, _ = core_algos.get_adv_estimator_fn("bk_grpo")(rewards, mask, uids, config=AlgoConfig())
    single = torch.tensor([False] * 4 + [True] + [False] * 3)
    torch.testing.assert_close(got[~single], expect[~single], rtol=1e-5, atol=1e-6)
    assert (got[single] == 0).all()
    torch.testing.assert_close(expect[single], rewards[single].sum(-1, keepdim=True) / (1 + 1e-6) * mask[single])
