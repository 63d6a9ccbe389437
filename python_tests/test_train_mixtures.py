"""The training driver with maxrl, --k-weights and the mixture form of k annealing."""

from __future__ import annotations

import json
import os

import pytest

import bonkernels as bk
from bonkernels.train.cli import main, parse_args
from bonkernels.train.trainer import k_at, k_weights_at

TINY = ["--model", "qwen2-micro", "--warmstart-steps", "3", "--warmstart-batch-size", "8",
        "--n", "4", "--batch-size", "2", "--eval-problems", "4", "--eval-n", "4",
        "--eval-every", "0", "--threads", "1", "--progress", "off", "--no-plots", "--no-export"]


def _records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("extra", [["--estimator", "maxrl"],
                                   ["--estimator", "maxk_loo1", "--k-weights", "harmonic:3"],
                                   ["--estimator", "maxk", "--k-weights", "0.5,0,1"]])
def test_train_runs_with_maxrl_and_k_weights(tmp_path, extra):
    out = str(tmp_path / "run")
    main([*TINY, "--steps", "2", "--out", out, *extra])
    train = [r for r in _records(out) if r["kind"] == "train"]
    assert len(train) == 2
    if "--k-weights" in extra:
        assert train[0]["k_weights"] == list(bk.tables.parse_k_weights(extra[-1]))


def test_k_annealing_as_a_mixture():
    cfg = parse_args(["--k", "8", "--k-final", "1", "--steps", "8", "--k-schedule", "mixture", "--n", "8"])
    first, last = k_weights_at(1, cfg), k_weights_at(8, cfg)
    assert first == tuple([0.0] * 7 + [1.0]) and last == (1.0,)
    mid = k_weights_at(4, cfg)                       # progress 3/7: k(p) = 5
    assert mid == bk.anneal_k_weights(8, 1, 3 / 7)[:len(mid)]
    assert [k_at(s, cfg) for s in range(1, 9)] == [len(k_weights_at(s, cfg)) for s in range(1, 9)]
    # the old schedules are unchanged
    assert k_weights_at(3, parse_args(["--k", "8", "--k-final", "1", "--steps", "8"])) is None
    cfg = parse_args(["--k-weights", "harmonic:4"])
    assert k_weights_at(5, cfg) == bk.maxrl_weights(4) and k_at(5, cfg) == 4


def test_k_weights_validation(tmp_path):
    with pytest.raises(ValueError, match="cannot mix k"):
        main([*TINY, "--estimator", "bon_mean", "--k-weights", "harmonic:2", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="at most 3"):
        main([*TINY, "--estimator", "maxk_loo", "--k-weights", "harmonic:4", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="replaces --k"):
        main([*TINY, "--k-weights", "harmonic:2", "--k-final", "1", "--out", str(tmp_path)])
