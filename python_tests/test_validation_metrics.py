"""Validation metrics (bonkernels.integrations.metrics and its verl / TRL front ends).

The metrics are checked against brute-force enumeration over all k-subsets (oracle.py) on fresh
random batches; verl's drop-in is checked against verl's installed ``process_validation_metrics``
(its own metrics unchanged, ours added) and on verl issue 7240's example, where verl's bootstrap
best@4 is about 0.68 for a prompt with one correct sample in four and the unbiased pass@4 is 1.
"""

import random
from fractions import Fraction

import numpy as np
import pytest
import torch

import oracle
from bonkernels.integrations import metrics as bk_metrics


def _batch(rng, sizes, binary):
    """Rewards and string uids in a shuffled order, as a validation batch arrives."""
    rows = []
    for g, n in enumerate(sizes):
        for _ in range(n):
            value = float(rng.random() < 0.35) if binary else round(rng.random(), 3)
            rows.append((value, f"uid-{g:03d}"))
    rng.shuffle(rows)
    return [r for r, _ in rows], [u for _, u in rows]


def _groups(rewards, uids):
    by_uid = {}
    for r, u in zip(rewards, uids):
        by_uid.setdefault(u, []).append(r)
    return [by_uid[u] for u in sorted(by_uid)]


def _mean(values):
    return float(sum(values, Fraction(0)) / len(values))


@pytest.mark.parametrize("binary", [False, True])
def test_metrics_equal_enumeration(binary):
    seed = oracle.fresh_seed()
    rng = random.Random(seed)
    sizes = [rng.randint(4, 8) for _ in range(7)]
    rewards, uids = _batch(rng, sizes, binary)
    ks = [1, 2, 3, 4]
    weights = [0.5, 0.0, 0.25, 1.0]
    got = bk_metrics.validation_metrics(rewards, uids, ks, k_weights=weights)
    groups = _groups(rewards, uids)
    for k in ks:
        assert got[f"max@{k}"] == pytest.approx(_mean([oracle.max_at_k(g, k) for g in groups]), abs=1e-12), seed
        if binary:
            assert got[f"pass@{k}"] == pytest.approx(_mean([oracle.pass_at_k(g, k) for g in groups]), abs=1e-12), seed
    mixed = _mean([sum((Fraction(w) * oracle.max_at_k(g, k) for k, w in enumerate(weights, 1)), Fraction(0))
                   for g in groups])
    assert got["max_mix@4"] == pytest.approx(mixed, abs=1e-12), seed
    assert ("pass@1" in got) == binary and ("pass_mix@4" in got) == binary


def test_default_ks_small_groups_and_errors():
    rewards, uids = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], ["a"] * 4 + ["b"] * 2
    assert sorted(bk_metrics.validation_metrics(rewards, uids)) == ["max@1", "max@2", "pass@1", "pass@2"]
    with pytest.raises(ValueError, match="group"):
        bk_metrics.validation_metrics(rewards, uids, [4])
    clamped = bk_metrics.per_group_metrics(rewards, uids, [4], small_groups="clamp")
    assert clamped["pass@4"].tolist() == [1.0, 1.0]     # group "b" (2 samples): k = 2
    correct = [True, False, False, False, True, False]
    graded = [0.9, 0.1, 0.2, 0.3, 0.8, 0.4]
    got = bk_metrics.validation_metrics(graded, uids, [2], correct=correct)
    assert got["pass@2"] == pytest.approx((0.5 + 1.0) / 2) and "max@2" in got
    with pytest.raises(ValueError, match="NaN"):
        bk_metrics.validation_metrics([float("nan"), 1.0], ["a", "a"], [1])
    with pytest.raises(ValueError, match="k_weights"):
        bk_metrics.validation_metrics(rewards, uids, [1], k_weights=[-1.0, 1.0])
    with pytest.raises(ValueError, match="one id per sample"):
        bk_metrics.validation_metrics(rewards, uids[:3], [1])


def test_verl_issue_7240_example_against_verl_bootstrap():
    metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")
    from bonkernels.integrations import verl_validation

    sources, uids, infos = ["math"] * 4, ["p0"] * 4, {"acc": [1.0, 0.0, 0.0, 0.0]}
    verl_result = metric_utils.process_validation_metrics(sources, uids, infos)
    best4 = verl_result["math"]["acc"]["best@4/mean"]
    assert 0.63 < best4 < 0.74 and abs(best4 - (1 - 0.75 ** 4)) < 0.05   # verl's bootstrap: about 0.684
    ours = verl_validation.unbiased_metrics(sources, uids, infos)["math"]["acc"]
    assert ours["pass@4"] == 1.0 and ours["pass@1"] == 0.25 and ours["pass@2"] == 0.5
    assert ours["max@4"] == 1.0


def test_verl_drop_in_adds_to_verls_own_metrics(monkeypatch):
    metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")
    from bonkernels.integrations import verl_validation

    seed = oracle.fresh_seed()
    rng = random.Random(seed)
    acc, uids = _batch(rng, [4] * 6, binary=True)
    score = [a * 0.5 + round(rng.random(), 3) for a in acc]
    sources = ["gsm8k" if u < "uid-003" else "math" for u in uids]
    infos = {"acc": acc, "score": score, "pred": ["x"] * len(acc)}
    original = metric_utils.process_validation_metrics
    monkeypatch.setattr(metric_utils, "process_validation_metrics", original)   # restored after the test
    monkeypatch.setattr(verl_validation, "_SETTINGS", dict(verl_validation._SETTINGS))
    verl_validation.install(ks=[1, 4], k_weights=[1.0, 0.0, 0.0, 1.0])
    from verl.trainer.ppo.metric_utils import process_validation_metrics   # what verl's trainer imports
    assert process_validation_metrics is verl_validation.process_validation_metrics
    got = process_validation_metrics(sources, uids, infos)
    expect = original(sources, uids, infos)
    for source in ("gsm8k", "math"):
        picked = [i for i, s in enumerate(sources) if s == source]
        for var in ("acc", "score"):
            assert {k: v for k, v in got[source][var].items() if k in expect[source][var]} == dict(expect[source][var])
            groups = _groups([infos[var][i] for i in picked], [uids[i] for i in picked])
            for k in (1, 4):
                assert got[source][var][f"max@{k}"] == pytest.approx(_mean([oracle.max_at_k(g, k) for g in groups])), seed
            mix = _mean([oracle.max_at_k(g, 1) + oracle.max_at_k(g, 4) for g in groups])
            assert got[source][var]["max_mix@4"] == pytest.approx(mix), seed
        assert "pass@4" in got[source]["acc"] and "pass@4" not in got[source]["score"]
        assert "pred" not in got[source]
    # k above the groups' size is left out (it would also move verl's headline metrics out of val-core)
    big = verl_validation.unbiased_metrics(sources, uids, infos, ks=[1, 8], k_weights=[0] * 7 + [1])
    assert sorted(big["math"]["acc"]) == ["max@1", "pass@1"]
    # verl's logger reads k from the text after '@' in every name: ours keep that form
    for name in got["math"]["acc"]:
        int(name.split("@")[-1].split("/")[0])


@pytest.mark.slow
def test_trl_callback_logs_unbiased_metrics(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from test_integration_trl import tiny_model, tiny_tokenizer
    from bonkernels.integrations.trl_callbacks import PassAtKCallback

    tokenizer = tiny_tokenizer()
    prompts = datasets.Dataset.from_dict({"prompt": ["abc", "2+2=", "say a", "hi"]})
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                          num_generations=4, num_generations_eval=4, max_completion_length=4, max_steps=1,
                          use_cpu=True, report_to="none", save_strategy="no")
    trainer = trl.GRPOTrainer(model=tiny_model(tokenizer), args=args, processing_class=tokenizer,
                              reward_funcs=lambda completions, **kw: [float("a" in c) for c in completions],
                              train_dataset=prompts, eval_dataset=prompts)
    callback = PassAtKCallback(trainer, ks=[1, 2, 4], k_weights=[1.0, 0.0, 0.0, 0.5])
    trainer.add_callback(callback)
    result = trainer.evaluate()
    rewards, gids = callback.last_rewards, callback.last_group_ids
    assert rewards.numel() == 16 and torch.bincount(gids).tolist() == [4, 4, 4, 4]
    groups = [rewards[gids == g].tolist() for g in range(4)]
    for k in (1, 2, 4):
        assert result[f"eval_pass@{k}"] == pytest.approx(_mean([oracle.pass_at_k(g, k) for g in groups]))
        assert result[f"eval_max@{k}"] == pytest.approx(_mean([oracle.max_at_k(g, k) for g in groups]))
    assert result["eval_max_mix@4"] == pytest.approx(result["eval_max@1"] + 0.5 * result["eval_max@4"])
    logged = [entry for entry in trainer.state.log_history if "eval_pass@4" in entry]
    assert logged and logged[-1]["eval_pass@4"] == result["eval_pass@4"]
    assert callback._rewards == []       # the next evaluation starts afresh
