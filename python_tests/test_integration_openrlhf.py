"""bonkernels.integrations.openrlhf against the installed OpenRLHF (skipped when it is absent).

OpenRLHF's own ``RemoteExperienceMaker.compute_advantages_and_returns`` (the installed code) and the
bonkernels subclass run on identical experiences; ``bk_rloo``, ``bk_dr_grpo`` and ``bk_grpo`` must
give OpenRLHF's ``rloo``, ``dr_grpo`` / ``reinforce_baseline`` and ``group_norm`` numbers.
"""

import copy
import os
import sys
from types import SimpleNamespace

import pytest
import torch

import bonkernels as bk
from import_stubs import stubbed

pytest.importorskip("openrlhf", reason="OpenRLHF is not installed (scripts/setup.sh installs openrlhf==0.11.2 --no-deps)")
with stubbed():
    try:
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
        from openrlhf.trainer import ppo_trainer  # noqa: F401  (install() patches its name)
    except ImportError as e:   # a missing pure-Python import of OpenRLHF's: say which
        pytest.skip(f"OpenRLHF's experience maker cannot be imported here: {e}", allow_module_level=True)

from bonkernels.integrations import openrlhf as bk_openrlhf  # noqa: E402


def _args(estimator, n, *, kl_coef=0.0, clip_range=None, no_std_norm=False, **bk):
    advantage = SimpleNamespace(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=no_std_norm, **bk)
    return SimpleNamespace(algo=SimpleNamespace(advantage=advantage),
                           rollout=SimpleNamespace(n_samples_per_prompt=n, max_new_tokens=8),
                           reward=SimpleNamespace(clip_range=clip_range, overlong_buffer_len=None,
                                                  stop_properly_penalty_coef=None),
                           data=SimpleNamespace(max_len=16))


def _maker(cls, args, kl_coef=0.0):
    strategy = SimpleNamespace(args=args)
    return cls(None, None, None, None, FixedKLController(kl_coef), strategy, None)


def _experiences(prompts, n, *, T=6, seed=0, binary=False, with_kl=False):
    """Rollout samples shuffled over micro-batches of uneven size, as OpenRLHF hands them over."""
    gen = torch.Generator().manual_seed(seed)
    N = prompts * n
    perm = torch.randperm(N, generator=gen)
    rewards = (torch.rand(N, generator=gen) > 0.6).float() if binary else torch.rand(N, generator=gen)
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kl = torch.rand(N, T, generator=gen) * 0.1 if with_kl else torch.zeros(N, T)
    out, start = [], 0
    for size in _split(N, gen):
        idx = perm[start:start + size]
        out.append(Experience(action_mask=mask[idx].clone(), kl=kl[idx].clone(), rewards=rewards[idx].clone(),
                              index=idx.tolist(), info={}))
        start += size
    return out, rewards


def _split(N, gen):
    sizes = []
    while N > 0:
        s = min(N, int(torch.randint(1, 6, (1,), generator=gen)))
        sizes.append(s)
        N -= s
    return sizes


def _run(cls, args, exps, kl_coef=0.0):
    exps = copy.deepcopy(exps)
    _maker(cls, args, kl_coef).compute_advantages_and_returns(exps)
    return exps


def _bk_class():
    return bk_openrlhf.install()


PARITY = [("rloo", "rloo", {}), ("dr_grpo", "dr_grpo", {}), ("reinforce_baseline", "dr_grpo", {"bk_batch_normalize": True}),
          ("group_norm", "grpo", {})]


@pytest.mark.parametrize("theirs,ours,extra", PARITY, ids=[p[0] for p in PARITY])
@pytest.mark.parametrize("binary", [False, True])
def test_parity_with_openrlhf(theirs, ours, extra, binary):
    n = 4
    exps, _ = _experiences(5, n, seed=11 + binary, binary=binary, with_kl=True)
    expect = _run(RemoteExperienceMaker, _args(theirs, n, clip_range=(-10, 10)), exps, kl_coef=0.05)
    got = _run(_bk_class(), _args("bk_" + ours, n, clip_range=(-10, 10), **extra), exps, kl_coef=0.05)
    for e, g in zip(expect, got):
        torch.testing.assert_close(g.advantages, e.advantages, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.returns, e.returns, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.info["return"], e.info["return"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.info["group_reward_std"], e.info["group_reward_std"])
        assert g.kl is None and e.kl is None
    assert any((e.advantages != 0).any() for e in expect)


@pytest.mark.parametrize("estimator,k", [("maxk_loo1", 3), ("maxk", 2), ("passk", 4), ("tang_loo", None)])
def test_bonkernels_estimators_on_the_openrlhf_path(estimator, k):
    """Each sample's advantage sits on every response token (gamma = 1, no KL): the bonkernels value."""
    n = 6
    exps, rewards = _experiences(4, n, seed=3, binary=(estimator == "passk"))
    got = _run(_bk_class(), _args("bk_" + estimator, n, bk_k=k), exps)
    expect = bk.advantages(rewards.view(-1, n).double(), k or 1, estimator).reshape(-1).float()
    for exp in got:
        for row, i in enumerate(exp.index):
            m = exp.action_mask[row]
            torch.testing.assert_close(exp.advantages[row][m], expect[i].expand(int(m.sum())), rtol=1e-6, atol=1e-6)
            assert (exp.advantages[row][~m] == 0).all()


def test_settings_order(monkeypatch):
    n = 4
    exps, rewards = _experiences(3, n, seed=5)
    expect2 = bk.advantages(rewards.view(-1, n).double(), 2, "maxk", scale="sum").reshape(-1).float()
    monkeypatch.setenv("BONKERNELS_K", "3")
    monkeypatch.setenv("BONKERNELS_SCALE", "sum")
    got = _run(_bk_class(), _args("bk_maxk", n, bk_k=2), exps)    # OpenRLHF's config beats the environment
    first = got[0]
    torch.testing.assert_close(first.advantages[0][first.action_mask[0]][0], expect2[first.index[0]])
    expect3 = bk.advantages(rewards.view(-1, n).double(), 3, "maxk", scale="sum").reshape(-1).float()
    got = _run(_bk_class(), _args("bk_maxk", n), exps)
    torch.testing.assert_close(got[0].advantages[0][got[0].action_mask[0]][0], expect3[got[0].index[0]])


def test_k_weights_from_config_is_the_mixture():
    import inspect
    if "k_weights" not in inspect.signature(bk.advantages).parameters:
        with pytest.raises(ValueError, match="mixtures over k"):
            _run(_bk_class(), _args("bk_maxk_loo1", 4, bk_k_weights=[1.0, 0.5]), _experiences(2, 4)[0])
        pytest.skip("this bonkernels has no k_weights yet: the adapter says so (checked above)")
    n = 4
    exps, rewards = _experiences(3, n, seed=9)
    got = _run(_bk_class(), _args("bk_maxk_loo1", n, bk_k_weights=[1.0, 0.5]), exps)
    by_k = [bk.advantages(rewards.view(-1, n).double(), k, "maxk_loo1").reshape(-1) for k in (1, 2)]
    expect = (by_k[0] + 0.5 * by_k[1]).float()
    e = got[0]
    torch.testing.assert_close(e.advantages[0][e.action_mask[0]][0], expect[e.index[0]], rtol=1e-5, atol=1e-6)


def test_other_estimators_are_openrlhfs_own():
    n = 4
    exps, _ = _experiences(3, n, seed=2)
    expect = _run(RemoteExperienceMaker, _args("rloo", n), exps)
    got = _run(_bk_class(), _args("rloo", n), exps)
    for e, g in zip(expect, got):
        torch.testing.assert_close(g.advantages, e.advantages)


def test_errors():
    exps, _ = _experiences(2, 4)
    with pytest.raises(ValueError, match="needs k"):
        _run(_bk_class(), _args("bk_maxk_loo1", 4), exps)
    with pytest.raises(ValueError, match="current policy"):
        bk_openrlhf.group_advantages(torch.rand(2, 4), "maxk_offpolicy", k=2)
    with pytest.raises(ValueError, match="k = 5"):
        _run(_bk_class(), _args("bk_maxk", 4, bk_k=5), exps)
    with pytest.raises(ValueError, match="n_samples_per_prompt > 1"):
        _run(_bk_class(), _args("bk_grpo", 1), _experiences(3, 1)[0])


def test_cli_accepts_bk_estimators(monkeypatch):
    """OpenRLHF's own train_ppo_ray parser, run through main(): bk_* choices and settings reach args."""
    import ray

    class Parsed(Exception):
        pass

    def capture(args):
        raise Parsed(args)

    with stubbed():
        import openrlhf.utils
        import openrlhf.cli.train_ppo_ray  # noqa: F401  (its imports, under the stubs)
    monkeypatch.delitem(sys.modules, "openrlhf.cli.train_ppo_ray")   # main() runs it afresh as __main__
    monkeypatch.setattr(openrlhf.utils, "get_strategy", capture)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    argv = ["--actor.model_name_or_path", "m", "--rollout.n_samples_per_prompt", "4",
            "--algo.advantage.estimator", "bk_maxk_loo1", "--algo.advantage.bk_k", "4",
            "--algo.advantage.bk_k_weights", "1", "0.5"]
    with pytest.raises(Parsed) as info:
        bk_openrlhf.main(argv, init_ray=False)
    adv = info.value.args[0].algo.advantage
    assert adv.estimator == "bk_maxk_loo1" and adv.bk_k == 4 and adv.bk_k_weights == [1.0, 0.5]
    assert adv.bk_batch_normalize is None
    assert ppo_trainer.RemoteExperienceMaker is bk_openrlhf.BonkernelsExperienceMaker
    import argparse
    with pytest.raises(SystemExit):   # outside main() the stock parser is back: bk_* is refused
        p = argparse.ArgumentParser()
        p.add_argument("--algo.advantage.estimator", choices=["rloo"])
        p.parse_args(["--algo.advantage.estimator", "bk_maxk"])


@pytest.mark.slow
def test_ray_workers_run_the_install_hook(monkeypatch):
    """main()'s Ray job environment: every worker imports the adapter and sees BONKERNELS_*."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    monkeypatch.setenv("BONKERNELS_K", "4")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(bk.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    env = bk_openrlhf.ray_runtime_env()
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=env)
    try:
        @ray.remote
        def probe():
            return "bonkernels.integrations.openrlhf" in sys.modules, os.environ.get("BONKERNELS_K")

        assert ray.get(probe.remote()) == (True, "4")
    finally:
        ray.shutdown()
