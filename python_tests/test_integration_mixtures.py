"""Mixtures over k and maxrl through the verl and TRL adapters (each part skipped without its package)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bonkernels as bk


# ----------------------------------------------------------------------------- verl

def _verl_batch(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bs = sum(sizes)
    uids = np.array([f"g{i}" for i, n in enumerate(sizes) for _ in range(n)], dtype=object)
    uids = uids[torch.randperm(bs, generator=gen).numpy()]
    mask = torch.ones(bs, 5)
    rewards = torch.zeros(bs, 5)
    rewards[:, -1] = (torch.rand(bs, generator=gen) > 0.5).float()
    _, inverse = np.unique(uids, return_inverse=True)
    return rewards, mask, uids, torch.as_tensor(inverse)


def test_verl_registers_maxrl_and_takes_k_weights(monkeypatch):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from bonkernels.integrations import verl as bk_verl

    rewards, mask, uids, ids = _verl_batch([4, 6, 4, 5])
    got, _ = core_algos.get_adv_estimator_fn("bk_maxrl")(rewards, mask, uids, config=None)
    expect = bk.advantages(rewards.sum(-1).double(), estimator="maxrl", group_ids=ids, backend="torch")
    torch.testing.assert_close(got, expect.float()[:, None] * mask)

    w = bk.maxrl_weights(3)
    expect = bk.advantages(rewards.sum(-1).double(), estimator="maxk_loo1", k_weights=w, group_ids=ids,
                           backend="torch")
    fn = core_algos.get_adv_estimator_fn("bk_maxk_loo1")
    got, _ = fn(rewards, mask, uids, config={"bk_k_weights": "harmonic:3"})           # config spelling
    torch.testing.assert_close(got, expect.float()[:, None] * mask)
    got, _ = fn(rewards, mask, uids, config={"bk_k_weights": list(w)})                # config list
    torch.testing.assert_close(got, expect.float()[:, None] * mask)
    monkeypatch.setenv("BONKERNELS_K_WEIGHTS", ",".join(str(v) for v in w))           # environment
    got, _ = fn(rewards, mask, uids, config=None)
    torch.testing.assert_close(got, expect.float()[:, None] * mask)
    monkeypatch.delenv("BONKERNELS_K_WEIGHTS")
    bk_verl.configure(k_weights="harmonic:3")                                          # configure()
    try:
        got, _ = fn(rewards, mask, uids, config=None)
        # an estimator that cannot mix k keeps using k
        z, _ = core_algos.get_adv_estimator_fn("bk_bon_mean")(rewards, mask, uids, config={"bk_k": 2})
    finally:
        bk_verl._SETTINGS["k_weights"] = None
    torch.testing.assert_close(got, expect.float()[:, None] * mask)
    assert torch.isfinite(z).all()


def test_parse_k_weights_spellings():
    from bonkernels.tables import parse_k_weights
    assert parse_k_weights("harmonic:3") == bk.maxrl_weights(3)
    assert parse_k_weights("uniform:2") == (1.0, 1.0)
    assert parse_k_weights("0.5, 0, 1") == (0.5, 0.0, 1.0)
    for bad in ("harmonic:x", "harmonic:0", "a,b", "0,0"):
        with pytest.raises(ValueError):
            parse_k_weights(bad)


# ----------------------------------------------------------------------------- TRL

def test_trl_trainer_takes_k_weights_and_maxrl(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    try:
        from .test_integration_trl import NUM_GENERATIONS, RecordingTrainer, tiny_model, tiny_tokenizer
    except ImportError:
        from test_integration_trl import NUM_GENERATIONS, RecordingTrainer, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    seen_rewards = []

    def reward(completions, **kwargs):
        out = [c.count("a") / max(len(c), 1) + 0.01 * len(c) for c in completions]
        seen_rewards.append(torch.tensor(out, dtype=torch.float64))
        return out

    dataset = datasets.Dataset.from_dict({"prompt": ["say aaa.", "abc"] * 4})
    for estimator, extra, expect_kw in (
            ("maxk_loo1", {"k_weights": "harmonic:3"}, {"k_weights": bk.maxrl_weights(3)}),
            ("maxrl", {}, {})):
        seen_rewards.clear()
        args = trl.GRPOConfig(output_dir=str(tmp_path / estimator), per_device_train_batch_size=8,
                              num_generations=NUM_GENERATIONS, max_completion_length=5, max_steps=1,
                              learning_rate=1e-2, use_cpu=True, report_to="none", save_strategy="no", seed=0,
                              beta=0.0, dataloader_num_workers=0)
        trainer = RecordingTrainer(model=tiny_model(tokenizer), reward_funcs=reward, args=args,
                                   train_dataset=dataset, processing_class=tokenizer, estimator=estimator, **extra)
        trainer.train()
        ours, _ = trainer.seen[0]
        expect = bk.advantages(seen_rewards[0].view(-1, NUM_GENERATIONS), estimator=estimator, backend="torch",
                               **expect_kw).reshape(-1)
        torch.testing.assert_close(ours.double(), expect, rtol=1e-5, atol=1e-6)
    tokenizer_model = dict(model=tiny_model(tokenizer), reward_funcs=reward, args=args, train_dataset=dataset,
                           processing_class=tokenizer)
    with pytest.raises(ValueError, match="either k or k_weights"):
        RecordingTrainer(estimator="maxk", k=2, k_weights=[1.0, 1.0], **tokenizer_model)
    with pytest.raises(ValueError, match="does not apply"):
        RecordingTrainer(estimator="bon_mean", k_weights=[1.0, 1.0], **tokenizer_model)
