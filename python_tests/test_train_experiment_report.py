"""The full experiment's report on synthetic run directories built here (no model runs): the
collection of per-prompt evaluations, the paired comparisons, each claim's verdict, the markdown,
the plots, and ``python -m bonkernels.train.experiment --report-only``."""

import json
import os

import numpy as np
import pytest

from bonkernels.train import experiment_plots, experiment_report as rep
from bonkernels.train.experiment import main as experiment_main

P, N, STEPS, SEEDS = 60, 16, 20, (0, 1, 2)


def _write_eval(run_dir, step, rewards):
    os.makedirs(os.path.join(run_dir, "eval_rewards"), exist_ok=True)
    with open(os.path.join(run_dir, "eval_rewards", f"step-{step:06d}.json"), "w") as f:
        json.dump({"step": step, "samples": step * 16, "keys": [f"eval/{i}" for i in range(P)],
                   "rewards": rewards.tolist()}, f)


def _rewards(rng, p_correct):
    """[P, N] rewards: each completion fully correct with its prompt's probability, else a
    partial credit below 1."""
    correct = rng.random((P, N)) < p_correct[:, None]
    return np.where(correct, 1.0, rng.uniform(0, 0.9, size=(P, N)))


# per arm: the probability of a correct completion at each evaluation step (per prompt, times a
# prompt difficulty); the arms are made so that the claims' verdicts are known
LEVELS = {
    "grpo": {10: 0.04, 20: 0.03},
    "good": {10: 0.10, 20: 0.16},          # far above the warm start and GRPO
    "anneal": {10: 0.08, 20: 0.12},
    "maxrl": {10: 0.05, 20: 0.05},         # no better than the warm start
    "bad": {10: 0.02, 20: 0.01},           # below GRPO
    "harmonic": {10: 0.06, 20: 0.07},
    "one epoch": {10: 0.05, 20: 0.07},
    "reuse": {10: 0.09, 20: 0.10},         # reaches the one-epoch arm's final level by step 10
}
WARM = 0.05


def _spec():
    arms = [{"name": name, "estimator": "grpo" if name == "grpo" else "maxk_loo1"} for name in LEVELS]
    return {"train": {"steps": STEPS}, "seeds": list(SEEDS), "arms": arms,
            "analysis": {"grpo": "grpo", "maxk_family": ["good", "maxrl"], "anneal": "anneal",
                         "maxrl": "maxrl", "harmonic": "harmonic",
                         "offpolicy_one_epoch": "one epoch", "offpolicy_reuse": ["reuse"],
                         "k_sweep": ["maxrl", "good"],
                         "n_boot": 300}}


@pytest.fixture()
def runs(tmp_path):
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.2, 1.8, size=P)
    root = tmp_path / "runs"
    for seed in SEEDS:
        _write_eval(str(root / f"warmstart-s{seed}"), 0, _rewards(rng, WARM * difficulty))
        for name, levels in LEVELS.items():
            for step, level in levels.items():
                _write_eval(str(root / rep.run_name(name, seed)), step,
                            _rewards(rng, np.clip(level * difficulty, 0, 1)))
    # an unfinished run (no evaluation at the last step) is left out and listed
    _write_eval(str(root / rep.run_name("grpo", 7)), 10, _rewards(rng, WARM * difficulty))
    return str(root)


def test_names_and_flags():
    assert rep.slug("maxk_loo1 anneal k=8->1") == "maxk_loo1_anneal_k8_1"
    assert rep.run_name("maxk_offpolicy 3 epochs lr=1e-4", 2) == "maxk_offpolicy_3_epochs_lr1e_4-s2"
    assert rep.flags_to_argv({"k": 8, "k_final": 1, "clamp_delta": 0.2, "plots": False,
                              "eval_records": True, "synth_depth_weights": [0.5, 0.5]}) == [
        "--k", "8", "--k-final", "1", "--clamp-delta", "0.2", "--eval-records",
        "--synth-depth-weights", "0.5,0.5"]


def test_collect_analyse_and_write(runs, tmp_path):
    spec = _spec()
    data = rep.collect(runs, list(LEVELS), [*SEEDS, 7], STEPS)
    assert data["eval_n"] == N and data["prompts"] == P
    assert "grpo-s7" in data["missing"] and "warmstart-s7" in data["missing"]
    assert sorted(data["arms"]["grpo"]) == list(SEEDS)
    res = rep.analyse(data, spec, None, n_boot=300)
    # the table: mean ± sd over seeds of the dataset-level metric
    good = rep.final_tables(data, "good")
    vals = rep.dataset_metric(good, "pass@16")
    assert res["rows"]["good"]["pass@16"]["mean"] == pytest.approx(np.mean(vals))
    assert res["rows"]["good"]["pass@16"]["sd"] == pytest.approx(np.std(vals, ddof=1))
    # the curves start at the warm start (0 samples) and follow the evaluation steps
    c = res["curves"]["reuse"]["pass@1"]
    assert c["samples"] == [0, 160, 320] and c["n"] == [3, 3, 3]
    claims = res["claims"]
    assert claims["1"]["arms"]["good"]["met"] and claims["1"]["met"] is True
    assert not claims["1"]["arms"]["maxrl"]["above_warm"]
    assert claims["2"]["arms"]["reuse"]["faster"] and claims["2"]["met"] is True
    assert claims["2"]["arms"]["reuse"]["samples_to_target"] < claims["2"]["one_epoch_samples"]
    assert claims["3"]["met"] is True
    assert claims["4"]["met"] is None and "pass@1" in claims["4"]["final"]
    text = rep.markdown(res, spec, wall_seconds=120)
    assert "1. A max@k-family arm" in text and "**met**" in text
    assert "grpo-s7" in text and "2.0 min" in text
    assert "the best by mean final pass@16 is **good**" in text
    assert "| good | +0." in text.split("Paired differences from the warm start")[1]
    assert not claims["2"]["target_at_or_below_warm"]
    experiment_plots.plot_at_k(data, list(LEVELS), str(tmp_path / "k.png"))
    experiment_plots.plot_curves(res, str(tmp_path / "c.png"))
    assert os.path.getsize(tmp_path / "k.png") > 1000 and os.path.getsize(tmp_path / "c.png") > 1000


def test_claims_fail_when_the_data_say_so(runs):
    spec = _spec()
    # other roles: "maxrl" as the only family arm cannot meet claim 1; "bad" as the annealing arm
    # is below GRPO; GRPO as the "reuse" arm never reaches the one-epoch arm's level
    spec["analysis"].update(maxk_family=["maxrl"], anneal="bad", offpolicy_reuse=["grpo"])
    res = rep.analyse(rep.collect(runs, list(LEVELS), list(SEEDS), STEPS), spec, None, n_boot=300)
    assert res["claims"]["1"]["met"] is False
    assert res["claims"]["2"]["met"] is False
    assert res["claims"]["2"]["arms"]["grpo"]["samples_to_target"] is None
    # a one-epoch arm that ends below the warm start: every arm "reaches" it at 0 samples
    spec["analysis"].update(offpolicy_one_epoch="bad", offpolicy_reuse=["reuse"])
    res2 = rep.analyse(rep.collect(runs, list(LEVELS), list(SEEDS), STEPS), spec, None, n_boot=300)
    c2 = res2["claims"]["2"]
    assert c2["target_at_or_below_warm"] and c2["arms"]["reuse"]["samples_to_target"] == 0.0
    assert c2["met"] is False and "cannot favour reuse" in rep.markdown(res2, spec)
    assert res["claims"]["3"]["met"] is False
    assert "**not met**" in rep.markdown(res, spec)


def test_report_only_command(runs, tmp_path):
    spec = _spec()
    spec["analysis"]["gradvar"] = {"arms": ["maxrl", "harmonic"], "repeats": 8}
    os.makedirs(os.path.join(runs, "gradvar"))
    gradvar = {"arms": {"maxrl": {"trace_cov": 2.0, "mean_sq_norm": 1.0, "rel_var": 2.0},
                        "harmonic": {"trace_cov": 1.0, "mean_sq_norm": 1.0, "rel_var": 1.0}},
               "ratio": {"num": "harmonic", "den": "maxrl", "value": 0.5, "lo": 0.4, "hi": 0.6},
               "cosine": 0.9, "repeats": 8, "batch_size": 4, "n": 8,
               "by_reward": {"binary": {"ratio": {"num": "h", "den": "m", "value": 0.7, "lo": 0.6,
                                                  "hi": 0.8}, "cosine": 0.95}}}
    with open(os.path.join(runs, "gradvar", "gradvar.json"), "w") as f:
        json.dump(gradvar, f)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(spec))
    out = tmp_path / "out"
    assert experiment_main(["--config", str(config), "--out", str(out), "--runs", runs,
                            "--report-only"]) == 0
    text = (out / "results.md").read_text()
    assert "lower variance: harmonic" in text and "relative variance ratio" in text
    assert "with the binary reward: ratio 0.700 [0.600, 0.800]" in text
    results = json.loads((out / "results.json").read_text())
    assert results["claims"]["1"]["met"] is True
    for name in ("pass_max_at_k.png", "curves_vs_samples.png", "curves_offpolicy.png",
                 "diff_vs_grpo.png", "pass_at_k_by_arm.png", "max_at_k_by_arm.png"):
        assert os.path.getsize(out / name) > 1000


def test_schedule_dependencies(tmp_path):
    """Jobs wait for the jobs they name; a name that is not among the jobs finished earlier; a job
    whose dependency failed is skipped and counted as failed."""
    from bonkernels.train.experiment import _schedule

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text("{}")
    bad.write_text("{not json")
    log = str(tmp_path / "log.txt")
    jobs = [("a", [str(good)], log, "json.tool", ["finished-earlier"]),
            ("b", [str(bad)], log, "json.tool", []),
            ("c", [str(good)], log, "json.tool", ["b"]),
            ("d", [str(good)], log, "json.tool", ["a"])]
    assert _schedule(jobs, 2, 0.0) == ["b", "c"]
