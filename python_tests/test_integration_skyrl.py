"""bonkernels.integrations.skyrl against the installed SkyRL (skipped when it is absent).

Everything goes through SkyRL's own entry point, ``ppo_utils.compute_advantages_and_returns``,
which looks the estimator up in SkyRL's registry, exactly as its trainer does.

On Python < 3.12 the package ``skyrl.backends`` cannot be imported as a whole: its ``__init__``
imports the Tinker API types, which pydantic refuses there (``typing.TypedDict``). The PPO
utilities themselves do not need it, so below 3.12 the test loads them with that one package
``__init__`` skipped (the modules are SkyRL's installed files, unchanged).
"""

import os
import sys
import types
import uuid

import numpy as np
import pytest
import torch

import bonkernels as bk

skyrl = pytest.importorskip("skyrl", reason="SkyRL is not installed (scripts/setup.sh installs skyrl==0.3.0 --no-deps)")


def _import_ppo_utils():
    if sys.version_info < (3, 12) and "skyrl.backends" not in sys.modules:
        package = types.ModuleType("skyrl.backends")
        package.__path__ = [os.path.join(os.path.dirname(skyrl.__file__), "backends")]
        sys.modules["skyrl.backends"] = package
    from skyrl.backends.skyrl_train.utils import ppo_utils
    return ppo_utils


try:
    ppo_utils = _import_ppo_utils()
    from skyrl.train.config import AlgorithmConfig
except ImportError as e:
    pytest.skip(f"SkyRL's PPO utilities cannot be imported here: {e}", allow_module_level=True)

from bonkernels.integrations import skyrl as bk_skyrl  # noqa: E402


@pytest.fixture(autouse=True)
def registered():
    bk_skyrl.register(k=None)
    yield


def _batch(sizes, T=7, seed=0, binary=False):
    """SkyRL-style inputs: outcome reward on the last response token, uuid-string uids, shuffled."""
    gen = torch.Generator().manual_seed(seed)
    bs = sum(sizes)
    uids = np.array([str(uuid.UUID(int=g * 7919 + seed)) for g, n in enumerate(sizes) for _ in range(n)], dtype=object)
    uids = uids[torch.randperm(bs, generator=gen).numpy()]
    lengths = torch.randint(1, T + 1, (bs,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    scores = (torch.rand(bs, generator=gen) > 0.5).float() if binary else torch.rand(bs, generator=gen)
    rewards = torch.zeros(bs, T)
    rewards[torch.arange(bs), lengths - 1] = scores
    return rewards, mask, uids


def _skyrl(name, rewards, mask, uids, config=None, grpo_norm_by_std=True):
    return ppo_utils.compute_advantages_and_returns(
        token_level_rewards=rewards.clone(), response_mask=mask, index=uids, adv_estimator=name,
        config=config if config is not None else AlgorithmConfig(advantage_estimator=name),
        values=None, grpo_norm_by_std=grpo_norm_by_std, gamma=1.0, lambd=1.0)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("binary", [False, True])
def test_grpo_reproduces_skyrl_grpo(norm, binary):
    rewards, mask, uids = _batch([4, 2, 5, 8, 3], seed=1 + binary, binary=binary)
    expect, expect_ret = _skyrl("grpo", rewards, mask, uids, grpo_norm_by_std=norm)
    got, got_ret = _skyrl("bk_grpo", rewards, mask, uids, grpo_norm_by_std=norm)
    assert got.shape == expect.shape and got.dtype == expect.dtype
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_ret, expect_ret, rtol=1e-5, atol=1e-6)
    assert (expect != 0).any()


@pytest.mark.parametrize("binary", [False, True])
def test_rloo_reproduces_skyrl_rloo(binary):
    rewards, mask, uids = _batch([4, 2, 5, 8, 1, 3], seed=3 + binary, binary=binary)   # a singleton: 0 in both
    expect, _ = _skyrl("rloo", rewards, mask, uids)
    got, _ = _skyrl("bk_rloo", rewards, mask, uids)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


def test_every_estimator_registered_and_k_from_registration():
    available = ppo_utils.AdvantageEstimatorRegistry.list_available()
    for name in bk.ESTIMATORS:
        assert (("bk_" + name) in available) != name.startswith("maxk_offpolicy")
    bk_skyrl.register(["maxk_loo1"], k=3)
    rewards, mask, uids = _batch([4, 4, 4], seed=5, binary=True)
    got, ret = _skyrl("bk_maxk_loo1", rewards, mask, uids)
    _, inverse = np.unique(uids, return_inverse=True)
    expect = bk.advantages(rewards.sum(-1), 3, "maxk_loo1", group_ids=torch.as_tensor(inverse))
    torch.testing.assert_close(got, expect[:, None] * mask)
    torch.testing.assert_close(ret, got)


def test_settings_from_config_beat_registration_and_environment(monkeypatch):
    rewards, mask, uids = _batch([5, 5], seed=6)
    _, inverse = np.unique(uids, return_inverse=True)
    gid = torch.as_tensor(inverse)
    monkeypatch.setenv("BONKERNELS_K", "2")
    got, _ = _skyrl("bk_maxk_loo_centered", rewards, mask, uids)      # environment
    torch.testing.assert_close(got, bk.advantages(rewards.sum(-1), 2, "maxk_loo_centered", group_ids=gid)[:, None] * mask)
    bk_skyrl.register(["maxk"], k=3)
    config = AlgorithmConfig(advantage_estimator="bk_maxk")
    config.bk_k, config.bk_scale = 4, "sum"                           # the config wins
    got, _ = _skyrl("bk_maxk", rewards, mask, uids, config=config)
    torch.testing.assert_close(got, bk.advantages(rewards.sum(-1), 4, "maxk", group_ids=gid, scale="sum")[:, None] * mask)
    got, _ = _skyrl("bk_maxk", rewards, mask, uids)                   # registration beats the environment
    torch.testing.assert_close(got, bk.advantages(rewards.sum(-1), 3, "maxk", group_ids=gid)[:, None] * mask)


def test_k_weights():
    import inspect
    rewards, mask, uids = _batch([4, 4], seed=8)
    bk_skyrl.register(["maxk_loo1"], k_weights=[1.0, 0.5])
    if "k_weights" not in inspect.signature(bk.advantages).parameters:
        with pytest.raises(ValueError, match="mixtures over k"):
            _skyrl("bk_maxk_loo1", rewards, mask, uids)
        pytest.skip("this bonkernels has no k_weights yet: the adapter says so (checked above)")
    got, _ = _skyrl("bk_maxk_loo1", rewards, mask, uids)
    _, inverse = np.unique(uids, return_inverse=True)
    gid = torch.as_tensor(inverse)
    by_k = [bk.advantages(rewards.sum(-1), k, "maxk_loo1", group_ids=gid) for k in (1, 2)]
    torch.testing.assert_close(got, (by_k[0] + 0.5 * by_k[1])[:, None] * mask, rtol=1e-5, atol=1e-6)


def test_errors():
    rewards, mask, uids = _batch([4, 4], seed=7)
    with pytest.raises(ValueError, match="needs k"):
        _skyrl("bk_maxk_loo1", rewards, mask, uids)
    with pytest.raises(ValueError, match="current policy"):
        bk_skyrl.register(["maxk_offpolicy"])
    with pytest.raises(ValueError, match="k = 5"):
        bk_skyrl.compute_advantage(rewards, mask, uids, estimator="maxk", k=5)


def test_foreign_name_is_not_replaced():
    ppo_utils.AdvantageEstimatorRegistry.unregister("bk_grpo")
    ppo_utils.AdvantageEstimatorRegistry.register("bk_grpo", lambda **kw: None)
    try:
        with pytest.raises(ValueError, match="already has an advantage estimator named 'bk_grpo'"):
            bk_skyrl.register(["grpo"])
    finally:
        ppo_utils.AdvantageEstimatorRegistry.unregister("bk_grpo")
