"""The driver's per-prompt evaluation records (--eval-records), --no-initial-eval and the sample
counts that the experiment's paired tests and curves against samples read."""

import json
import os

import pytest

from bonkernels.train import experiment_stats as st
from bonkernels.train.cli import main

TINY = ["--model", "qwen2-micro", "--warmstart-steps", "3", "--warmstart-batch-size", "8",
        "--n", "4", "--k", "2", "--batch-size", "2", "--eval-problems", "4", "--eval-n", "4",
        "--threads", "1", "--progress", "off", "--no-plots", "--no-export"]


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_eval_records_match_the_logged_metrics(tmp_path):
    out = str(tmp_path / "run")
    main([*TINY, "--steps", "2", "--eval-every", "1", "--eval-records", "--no-initial-eval",
          "--out", out])
    records = _records(out)
    evals = [r for r in records if r["kind"] == "eval"]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in evals] == [1, 2]                  # no step-0 evaluation
    assert [r["samples"] for r in train] == [8, 16]              # step x batch x n
    assert [r["samples"] for r in evals] == [8, 16]
    files = sorted(os.listdir(os.path.join(out, "eval_rewards")))
    assert files == ["step-000001.json", "step-000002.json"]
    for name, logged in zip(files, evals):
        with open(os.path.join(out, "eval_rewards", name)) as f:
            rec = json.load(f)
        assert rec["step"] == logged["step"] and rec["samples"] == logged["samples"]
        assert rec["keys"] == [f"eval/{i}" for i in range(4)]
        assert len(rec["rewards"]) == 4 and all(len(row) == 4 for row in rec["rewards"])
        for metric in ("pass@1", "pass@2", "pass@4", "max@1", "max@4", "reward_mean"):
            assert st.per_prompt(rec["rewards"], metric).mean() == pytest.approx(logged[metric])


def test_default_run_evaluates_at_step_0_and_writes_no_records(tmp_path):
    out = str(tmp_path / "run")
    main([*TINY, "--steps", "1", "--eval-every", "1", "--out", out])
    assert [r["step"] for r in _records(out) if r["kind"] == "eval"] == [0, 1]
    assert not os.path.exists(os.path.join(out, "eval_rewards"))
