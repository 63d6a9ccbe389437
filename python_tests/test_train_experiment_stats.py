"""The experiment's statistics on synthetic data where the answer is known: per-prompt metrics,
the paired bootstrap over prompts and seeds, the sign-flip test, Holm's adjustment, curve
crossings, and the gradient-variance summary."""

import math

import numpy as np
import pytest
import torch

from bonkernels.train import experiment_gradvar as gv
from bonkernels.train import experiment_stats as st


def test_per_prompt_metrics_match_closed_forms():
    n = 8
    rewards = np.zeros((3, n))
    rewards[0, :3] = 1.0                                  # 3 of 8 correct
    rewards[1] = np.linspace(0.0, 0.7, n)                 # none correct, partial credit
    rewards[2] = 1.0
    for k in (1, 2, 4, 8):
        p = st.per_prompt(rewards, f"pass@{k}")
        assert p[0] == pytest.approx(1 - math.comb(n - 3, k) / math.comb(n, k))
        assert p[1] == 0.0 and p[2] == pytest.approx(1.0)
    # max@k of distinct values: sum_i v_(i) C(i-1, k-1) / C(n, k) (v sorted ascending)
    v = np.sort(rewards[1])
    for k in (1, 3, 8):
        want = sum(v[i] * math.comb(i, k - 1) for i in range(n)) / math.comb(n, k)
        assert st.per_prompt(rewards, f"max@{k}")[1] == pytest.approx(want)
    assert st.per_prompt(rewards, "reward_mean")[0] == pytest.approx(3 / 8)
    with pytest.raises(ValueError):
        st.per_prompt(rewards, "best@2")


def test_paired_bootstrap_recovers_a_known_shift():
    rng = np.random.default_rng(1)
    S, P = 5, 300
    difficulty = rng.uniform(0, 1, size=P)                # shared by both arms: the pairing
    b = difficulty + 0.05 * rng.standard_normal((S, P))
    a = difficulty + 0.01 + 0.05 * rng.standard_normal((S, P))
    res = st.paired_bootstrap(a, b, n_boot=1000, seed=0)
    assert res["lo"] < 0.01 < res["hi"]
    assert res["lo"] > 0 and res["p"] < 0.01
    # without the pairing (the other arm's prompts shuffled) the same shift is not detected
    unpaired = st.paired_bootstrap(a, b[:, rng.permutation(P)], n_boot=1000, seed=0)
    assert unpaired["lo"] < 0 < unpaired["hi"]
    # the shift is small next to the spread over prompts (sd 0.29): unpaired it would not show,
    # paired it does. Over prompts only, the bootstrap se matches the analytic one of the paired
    # mean difference; resampling seeds as well adds the seed-level spread (conservative)
    d = (a - b).mean(0)
    analytic = d.std(ddof=1) / math.sqrt(P)
    prompts_only = st.paired_bootstrap(a, b, n_boot=1000, seed=0, resample_seeds=False)
    assert prompts_only["se"] == pytest.approx(analytic, rel=0.15)
    assert analytic < res["se"] < 2 * analytic
    assert prompts_only["diff"] == res["diff"] == pytest.approx(float((a - b).mean()))
    # a single-seed arm against a multi-seed one (e.g. [P] values) works as well
    assert st.paired_bootstrap(a, b[0], n_boot=200)["n_seeds_b"] == 1


def test_paired_bootstrap_and_sign_flip_hold_their_level_under_the_null():
    rng = np.random.default_rng(2)
    covered, rejected_flip = 0, 0
    reps = 60
    for r in range(reps):
        difficulty = rng.uniform(0, 1, size=80)
        a = difficulty + 0.1 * rng.standard_normal((3, 80))
        b = difficulty + 0.1 * rng.standard_normal((3, 80))
        res = st.paired_bootstrap(a, b, n_boot=300, seed=r)
        covered += res["lo"] <= 0.0 <= res["hi"]
        rejected_flip += st.sign_flip_test(a, b, n_perm=500, seed=r)["p"] < 0.05
    assert covered / reps >= 0.85            # nominal 0.95; a broken pairing falls far below
    assert rejected_flip / reps <= 0.15      # nominal 0.05
    shifted = st.sign_flip_test(np.full((2, 50), 0.5) + 0.01 * np.arange(50) % 3,
                                np.full((2, 50), 0.4), n_perm=500)
    assert shifted["p"] < 0.01 and shifted["diff"] > 0


def test_paired_bootstrap_refuses_different_prompts():
    with pytest.raises(ValueError):
        st.paired_bootstrap(np.zeros((2, 5)), np.zeros((2, 6)))


def test_holm():
    adj = st.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adj == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert st.holm({"x": 0.6, "y": 0.9}) == pytest.approx({"x": 1.0, "y": 1.0})


def test_first_crossing_and_mean_sd():
    assert st.first_crossing([0, 10, 20], [0.1, 0.3, 0.5], 0.2) == pytest.approx(5.0)
    assert st.first_crossing([0, 10], [0.4, 0.5], 0.2) == 0.0
    assert st.first_crossing([0, 10], [0.1, 0.15], 0.2) is None
    assert st.mean_sd([1.0, 3.0]) == pytest.approx((2.0, math.sqrt(2.0)))
    assert st.mean_sd([2.0]) == (2.0, 0.0)


def test_gradient_variance_summary_on_known_gaussians():
    torch.manual_seed(0)
    R, D = 400, 50
    mu = torch.ones(D)
    noise = torch.randn(R, D)
    low = mu + 0.5 * noise                  # trace of Cov 0.25 D, |mean|^2 = D
    high = mu + 1.0 * noise                 # trace D: four times the relative variance
    out = gv.compare_variance({"low": low, "high": high}, "low", "high", n_boot=300)
    assert out["arms"]["low"]["trace_cov"] == pytest.approx(0.25 * D, rel=0.1)
    assert out["arms"]["high"]["trace_cov"] == pytest.approx(D, rel=0.1)
    assert out["arms"]["high"]["mean_sq_norm"] == pytest.approx(D + D / R, rel=0.1)
    assert out["ratio"]["value"] == pytest.approx(0.25, rel=0.1)
    assert out["ratio"]["lo"] < 0.25 < out["ratio"]["hi"] < 0.5
    assert out["cosine"] > 0.99
    # the relative variance does not depend on the estimator's scale
    scaled = gv.compare_variance({"a": 3.0 * low, "b": low}, "a", "b", n_boot=50)
    assert scaled["ratio"]["value"] == pytest.approx(1.0)
    assert scaled["cosine"] == pytest.approx(1.0)


def test_gradient_collection_shares_batches_between_arms():
    from bonkernels.train.cli import parse_args
    from bonkernels.train.models import load_model
    from bonkernels.train.tasks import make_task

    class Task:  # deterministic partial credit, so that groups are not constant
        max_new_tokens = 4

        def __init__(self):
            self.inner = make_task("synth", seed=1)

        def problem(self, split, key):
            return self.inner.problem(split, key)

        def rewards(self, problems, completions):
            return [(len(c) % 3) / 2 for c in completions]

    torch.manual_seed(0)
    model, tok = load_model("qwen2-micro", seed=0)
    base = ["--n", "4", "--batch-size", "2"]
    cfgs = {"maxrl": parse_args([*base, "--estimator", "maxrl"]),
            "maxrl again": parse_args([*base, "--estimator", "maxrl"]),
            "harmonic": parse_args([*base, "--estimator", "maxk_loo1", "--k-weights", "harmonic:3"])}
    grads = gv.collect_gradients(model, tok, Task(), cfgs, repeats=3, batch_size=2, n=4, seed=0,
                                 log=lambda m: None)
    D = sum(p.numel() for p in model.parameters())
    assert grads["maxrl"].shape == (3, D)
    assert torch.equal(grads["maxrl"], grads["maxrl again"])      # the same batches
    assert grads["maxrl"].abs().sum() > 0 and grads["harmonic"].abs().sum() > 0
    assert not torch.equal(grads["maxrl"][0], grads["maxrl"][1])   # fresh batches per repeat
