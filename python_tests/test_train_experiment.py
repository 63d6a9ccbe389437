"""The experiment's bookkeeping: arm parsing, aggregation over seeds, the table and the plot."""

import json
import os
import statistics

from bonkernels.train.experiment import collect, parse_arm, plot_results, results_table


def _summary(path, step, values, seed=0):
    os.makedirs(path, exist_ok=True)
    final = {"step": step, "num_prompts": 4, "reward_mean": values[0]}
    for k in (1, 2, 4):
        final[f"pass@{k}"] = values[0] * k / 4
        final[f"max@{k}"] = min(1.0, values[0] * k / 2)
    initial = dict(final, step=0, **{"pass@1": 0.01})
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"final": final, "initial": initial, "seed": seed}, f)


def test_parse_arm():
    assert parse_arm("grpo") == ("grpo", "grpo", [])
    assert parse_arm("maxk_offpolicy:--ppo-epochs=3") == (
        "maxk_offpolicy ppo-epochs=3", "maxk_offpolicy", ["--ppo-epochs=3"])


def test_collect_and_table(tmp_path):
    runs = str(tmp_path)
    _summary(os.path.join(runs, "warmstart"), 0, [0.1])
    for seed, v in zip([0, 1, 2], [0.2, 0.4, 0.3]):
        _summary(os.path.join(runs, f"grpo-s{seed}"), 10, [v], seed=seed)
    _summary(os.path.join(runs, "maxk_loo1-s0"), 5, [0.9])  # unfinished: must be left out
    res = collect(runs, ["grpo", "maxk_loo1"], [0, 1, 2], 10)
    assert res["ks"] == [1, 2, 4]
    assert res["arms"]["grpo"]["seeds"] == 3 and res["arms"]["maxk_loo1"]["seeds"] == 0
    table = results_table(res)
    m = statistics.fmean([0.2, 0.4, 0.3])
    s = statistics.stdev([0.2, 0.4, 0.3])
    assert f"{m:.3f} ± {s:.3f}" in table  # reward_mean column
    # one step-0 eval per seed: the warm-start run's (seed 0) and those of seeds 1 and 2
    assert len(res["warm_start_evals"]) == 3
    w = [0.025, 0.01, 0.01]
    assert (f"| warm start (before RL; 3 evals) | - | {statistics.fmean(w):.3f} ± "
            f"{statistics.stdev(w):.3f} |") in table
    plot_results(res, str(tmp_path / "p.png"))
    assert os.path.getsize(tmp_path / "p.png") > 1000
