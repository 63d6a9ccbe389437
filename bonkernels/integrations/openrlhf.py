"""bonkernels advantage estimators in OpenRLHF's PPO trainer.

OpenRLHF picks its advantage estimator with ``--algo.advantage.estimator`` (``rloo``,
``reinforce_baseline``, ``group_norm``, ``dr_grpo``, ...), inside its experience maker's
``compute_advantages_and_returns``. This module adds ``bk_<name>`` for every on-policy bonkernels
estimator there. Run OpenRLHF's PPO entry point through it::

    python -m bonkernels.integrations.openrlhf <train_ppo_ray flags> \\
        --algo.advantage.estimator bk_maxk_loo1 --algo.advantage.bk_k 4

(``--algo.advantage.bk_k_weights 1 0.5 0.25`` for a mixture over k, ``--algo.advantage.bk_scale``
``mean|sum``, ``--algo.advantage.bk_batch_normalize`` for OpenRLHF's batch whitening.) From Python,
:func:`install` does the same in the current process; :func:`main` also makes every Ray worker
call it, so the trainer actor builds :class:`BonkernelsExperienceMaker`.

What a ``bk_*`` estimator does, in OpenRLHF's order: length penalties (OpenRLHF's own), the
bonkernels advantage of each sequence reward within its prompt's group of
``n_samples_per_prompt``, then OpenRLHF's ``compute_reward`` (reward clip, KL penalty on the last
token) and cumulative returns with gamma = 1, as for OpenRLHF's group estimators. No batch
whitening unless asked (it would subtract a batch mean from unbiased estimates).
Parity (tested): ``bk_rloo`` is OpenRLHF's ``rloo``; ``bk_dr_grpo`` its ``dr_grpo`` and, with
``bk_batch_normalize``, its ``reinforce_baseline``; ``bk_grpo`` its ``group_norm`` (the std is the
sample std plus 1e-9, OpenRLHF's eps, this adapter's default).

Settings are read, in this order, from OpenRLHF's ``args.algo.advantage`` (``bk_k``,
``bk_k_weights``, ``bk_scale``, ``bk_batch_normalize``), from :func:`configure`, and from the
environment (``BONKERNELS_K``, ``BONKERNELS_K_WEIGHTS`` comma-separated, ``BONKERNELS_SCALE``).
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from typing import Optional, Sequence

import torch

from .. import estimators, validation
from ..ops import advantages as _advantages

PREFIX = "bk_"
OPENRLHF_EPS = 1e-9          # OpenRLHF's group_norm divides by std + 1e-9
_SETTINGS = {"k": None, "k_weights": None, "scale": None, "batch_normalize": None}


def estimator_names() -> list:
    """The names OpenRLHF accepts after :func:`install`: ``bk_<name>`` per on-policy estimator."""
    return [PREFIX + e for e in estimators.ESTIMATORS if not estimators.get(e).needs_deltas]


def configure(k: Optional[int] = None, k_weights: Optional[Sequence[float]] = None,
              scale: Optional[str] = None, batch_normalize: Optional[bool] = None) -> None:
    """Process-wide defaults (OpenRLHF's configuration, when it has the keys, wins)."""
    for key, value in (("k", k), ("k_weights", k_weights), ("scale", scale), ("batch_normalize", batch_normalize)):
        if value is not None:
            _SETTINGS[key] = value


def group_advantages(rewards: torch.Tensor, estimator: str, *, k: Optional[int] = None,
                     k_weights: Optional[Sequence[float]] = None, scale: str = "mean",
                     eps: float = OPENRLHF_EPS) -> torch.Tensor:
    """``[P, n]`` sequence rewards (one row per prompt) -> ``[P, n]`` advantages, in the rewards' dtype."""
    validation.check_trainer_estimator(estimator, "OpenRLHF", scale=scale, eps=eps, check_k_given=False)
    kwargs = {}
    if k_weights is not None:
        if "k_weights" not in inspect.signature(_advantages).parameters:
            raise ValueError("k_weights needs a bonkernels with mixtures over k (bonkernels.advantages(k_weights=...))")
        if k is not None:
            raise ValueError("give k or k_weights, not both")
        kwargs["k_weights"] = [float(w) for w in k_weights]
    else:
        validation.check_trainer_estimator(estimator, "OpenRLHF", k=k,
                                           k_hint="pass --algo.advantage.bk_k, call "
                                           "bonkernels.integrations.openrlhf.configure(k=...) or set BONKERNELS_K")
    with torch.no_grad():
        if "k_weights" in kwargs:
            adv = _advantages(rewards.to(torch.float64), estimator=estimator, scale=scale, eps=eps, **kwargs)
        else:
            adv = _advantages(rewards.to(torch.float64), 1 if k is None else int(k), estimator, scale=scale, eps=eps)
    return adv.to(rewards.dtype)


def _make_experience_maker_class(base):
    class BonkernelsExperienceMaker(base):
        """OpenRLHF's experience maker; ``bk_*`` estimators shape the rewards with bonkernels."""

        @torch.no_grad()
        def compute_advantages_and_returns(self, experiences):
            name = self.strategy.args.algo.advantage.estimator
            if not str(name).startswith(PREFIX):
                return super().compute_advantages_and_returns(experiences)
            return _bonkernels_advantages_and_returns(self, experiences, name[len(PREFIX):])

    return BonkernelsExperienceMaker


def _bonkernels_advantages_and_returns(maker, experiences, estimator: str):
    from openrlhf.models.utils import compute_reward
    from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties

    args = maker.strategy.args
    adv_cfg = args.algo.advantage
    n = args.rollout.n_samples_per_prompt
    if n < 2:   # every group would be a single sample: all advantages 0, a silent no-op run
        raise ValueError(f"bk_{estimator} compares the samples of a prompt: it needs "
                         f"--rollout.n_samples_per_prompt > 1, got {n}")
    k = _setting(adv_cfg, "k", "BONKERNELS_K")
    k_weights = _setting(adv_cfg, "k_weights", "BONKERNELS_K_WEIGHTS")
    if isinstance(k_weights, str):
        k_weights = [float(w) for w in k_weights.split(",") if w.strip()]
    scale = str(_setting(adv_cfg, "scale", "BONKERNELS_SCALE", "mean"))
    batch_normalize = bool(_setting(adv_cfg, "batch_normalize", "BONKERNELS_BATCH_NORMALIZE", False))

    for exp in experiences:   # group statistics in at least float32, as OpenRLHF
        exp.rewards = exp.rewards.to(torch.promote_types(exp.rewards.dtype, torch.float32))
    apply_length_penalties(experiences, args)

    # Rewards in prompt order (experience.index: each sample's position in the rollout), one row per prompt.
    sizes = [len(exp.index) for exp in experiences]
    order = torch.tensor(list(itertools.chain.from_iterable(exp.index for exp in experiences)))
    flat = torch.cat([exp.rewards for exp in experiences])
    if flat.numel() % n:
        raise ValueError(f"{flat.numel()} samples do not split into groups of n_samples_per_prompt = {n}")
    by_prompt = torch.empty_like(flat)
    by_prompt[order] = flat
    by_prompt = by_prompt.view(-1, n)
    if n > 1:
        stds = by_prompt.std(-1, keepdim=True).expand(-1, n).reshape(-1)[order].split(sizes)
        for exp, std in zip(experiences, stds):
            exp.info["group_reward_std"] = std
    adv = group_advantages(by_prompt, estimator, k=None if k is None or k_weights is not None else int(k),
                           k_weights=k_weights, scale=scale)
    shaped = adv.reshape(-1)[order].split(sizes)

    for exp, reward in zip(experiences, shaped):
        reward = compute_reward(reward, maker.kl_ctl.value, exp.kl, action_mask=exp.action_mask,
                                reward_clip_range=args.reward.clip_range)
        exp.returns = maker.get_cumulative_returns(reward, exp.action_mask, 1.0)
        exp.advantages = exp.returns.clone()
        exp.info["return"] = reward.sum(dim=-1)
        exp.kl = None

    if batch_normalize:   # OpenRLHF's whitening over every action token of the batch
        adv_all = torch.cat([exp.advantages.flatten() for exp in experiences]).float()
        mask_all = torch.cat([exp.action_mask.flatten() for exp in experiences])
        count = mask_all.sum()
        mean = (adv_all * mask_all).sum() / count
        rstd = 1
        if not getattr(adv_cfg, "no_std_norm", False):
            rstd = (((adv_all - mean).pow(2) * mask_all).sum() / count).clamp(min=1e-8).rsqrt()
        for exp in experiences:
            exp.advantages = (exp.advantages - mean) * rstd
    return experiences


def _setting(adv_cfg, key: str, env: str, default=None):
    value = getattr(adv_cfg, "bk_" + key, None)
    if value is None:
        value = _SETTINGS[key]
    if value is None:
        value = os.environ.get(env)
        if key == "batch_normalize" and value is not None:
            value = value.strip().lower() in ("1", "true", "yes")
    return default if value is None else value


BonkernelsExperienceMaker = None   # the subclass of OpenRLHF's RemoteExperienceMaker, set by install()


def install() -> type:
    """Make OpenRLHF's PPO trainer (in this process) build :class:`BonkernelsExperienceMaker`."""
    global BonkernelsExperienceMaker
    from openrlhf.trainer import ppo_trainer
    from openrlhf.trainer.ppo_utils import experience_maker

    if BonkernelsExperienceMaker is None:
        BonkernelsExperienceMaker = _make_experience_maker_class(experience_maker.RemoteExperienceMaker)
    ppo_trainer.RemoteExperienceMaker = BonkernelsExperienceMaker
    return BonkernelsExperienceMaker


class _ExtendOpenRLHFParser:
    """While active, OpenRLHF's argument parser accepts ``bk_*`` estimators and the ``bk_*`` settings."""

    def __enter__(self):
        import argparse

        self._add_argument = original = argparse.ArgumentParser.add_argument

        def add_argument(parser, *names, **kwargs):
            if "--algo.advantage.estimator" in names and "choices" in kwargs:
                kwargs["choices"] = list(kwargs["choices"]) + estimator_names()
                action = original(parser, *names, **kwargs)
                original(parser, "--algo.advantage.bk_k", type=int, default=None,
                         help="bonkernels: the pass@k / max@k target k")
                original(parser, "--algo.advantage.bk_k_weights", type=float, nargs="+", default=None,
                         help="bonkernels: weights of k = 1..T (a mixture over k)")
                original(parser, "--algo.advantage.bk_scale", choices=["mean", "sum"], default=None,
                         help="bonkernels: advantage scale (default mean)")
                original(parser, "--algo.advantage.bk_batch_normalize", action="store_true", default=None,
                         help="bonkernels: whiten the advantages over the batch, as OpenRLHF's reinforce_baseline")
                return action
            return original(parser, *names, **kwargs)

        argparse.ArgumentParser.add_argument = add_argument
        return self

    def __exit__(self, *exc):
        import argparse

        argparse.ArgumentParser.add_argument = self._add_argument
        return False


def ray_runtime_env() -> dict:
    """OpenRLHF's own job environment, the ``BONKERNELS_*`` variables, and a hook that runs
    :func:`install` in every Ray worker (OpenRLHF's trainer is a Ray actor)."""
    env = {"TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
           "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
           "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("BONKERNELS_")})
    return {"env_vars": env, "worker_process_setup_hook": "bonkernels.integrations.openrlhf._worker_setup"}


def main(argv: Optional[Sequence[str]] = None, init_ray: bool = True) -> None:
    """OpenRLHF's ``train_ppo_ray`` entry point with the ``bk_*`` estimators available."""
    import runpy

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    install()
    if init_ray:
        import ray

        if not ray.is_initialized():
            ray.init(runtime_env=ray_runtime_env())
    with _ExtendOpenRLHFParser():
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


def _worker_setup() -> None:
    try:
        install()
    except ImportError:   # a worker without OpenRLHF's trainer (e.g. an inference engine) has nothing to patch
        pass


if __name__ == "__main__":
    main()
