"""Resume under faults: SIGKILL at several points of a run (before the first checkpoint, mid-step,
halfway through a checkpoint write, twice in one run), then --resume: the metrics rows, weights
and optimiser state are bit-identical to an uninterrupted run. And the operator's mistakes: a
resume that changes settings (command line or --config file), nothing to resume, a damaged
checkpoint, a torn metrics line, a moved / relative / trailing-slash run directory."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from bonkernels.train import checkpoint as ckpt
from bonkernels.train.cli import main, parse_args
from bonkernels.train.trainer import MetricsLog

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = ["--model", "qwen2-micro", "--warmstart-steps", "3", "--warmstart-batch-size", "8",
        "--n", "4", "--k", "2", "--batch-size", "2", "--eval-problems", "4", "--eval-n", "4",
        "--threads", "1", "--progress", "off", "--no-plots", "--no-export"]
RUN = [*TINY, "--steps", "5", "--save-every", "2", "--eval-every", "2"]
KILL_POINTS = []  # (scenario, kills, bit-exact): the tally the last test prints


def _cli(args, cwd=REPO, fault=None):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("BONKERNELS_TRAIN_KILL_AT_STEP", None)
    if fault:
        env["BONKERNELS_TRAIN_FAULT"] = fault
    proc = subprocess.run([sys.executable, "-m", "bonkernels.train", *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def _rows(out):
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            rows.append({k: v for k, v in json.loads(line).items() if "seconds" not in k})
    return rows


def _assert_identical_runs(ref, run):
    assert _rows(run) == _rows(ref)
    a = ckpt.load(os.path.join(ref, "checkpoint.pt"))
    b = ckpt.load(os.path.join(run, "checkpoint.pt"))
    assert a["step"] == b["step"] == 5
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    opt_a, opt_b = a["optimizer"], b["optimizer"]
    assert opt_a["param_groups"] == opt_b["param_groups"]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for key, state in opt_a["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b["state"][key][name]))
    assert a["scheduler"] == b["scheduler"]
    assert not [f for f in os.listdir(run) if f.startswith(".")], "temporary files left"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ref") / "run")
    rc, output = _cli([*RUN, "--out", out])
    assert rc == 0, output
    return out


def _killed(args, fault, cwd=REPO):
    rc, output = _cli(args, cwd=cwd, fault=fault)
    assert rc == -signal.SIGKILL, output
    return output


def test_kill_before_the_first_checkpoint_then_resume_a_moved_run(reference, tmp_path):
    # killed in step 1 (nothing checkpointed yet); the directory is then moved and resumed by a
    # relative path with a trailing slash: the saved configuration is used, not the defaults
    _killed([*RUN, "--out", str(tmp_path / "a")], "after-log:1")
    assert not os.path.exists(tmp_path / "a" / "checkpoint.pt")
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    rc, output = _cli(["--resume", "--out", "b/"], cwd=str(tmp_path))
    assert rc == 0, output
    assert "restarting it from the beginning with its saved configuration" in output
    saved = json.load(open(tmp_path / "b" / "config.json"))
    assert saved["model"] == "qwen2-micro" and saved["steps"] == 5 and saved["warmstart_steps"] == 3
    _assert_identical_runs(reference, str(tmp_path / "b"))
    KILL_POINTS.append(("before the first checkpoint (moved, relative, trailing slash)", 1, True))


@pytest.mark.parametrize("fault", ["mid-step:3", "checkpoint-write:4"])
def test_kill_then_resume_is_bit_identical(reference, tmp_path, fault):
    out = str(tmp_path / "run")
    _killed([*RUN, "--out", out], fault)
    assert ckpt.load(os.path.join(out, "checkpoint.pt"))["step"] == 2
    temp = [f for f in os.listdir(out) if f.startswith(".checkpoint.pt.")]
    assert bool(temp) == fault.startswith("checkpoint-write"), temp
    rc, output = _cli(["--resume", "--out", out])
    assert rc == 0, output
    assert "at step 2" in output
    if temp:
        assert "removed 1 temporary file(s)" in output
    _assert_identical_runs(reference, out)
    KILL_POINTS.append((fault, 1, True))


def test_killed_twice_in_one_run(reference, tmp_path):
    out = str(tmp_path / "run")
    _killed([*RUN, "--out", out], "after-log:3")
    _killed(["--resume", "--out", out], "checkpoint-write:4")
    assert ckpt.load(os.path.join(out, "checkpoint.pt"))["step"] == 2
    rc, output = _cli(["--resume", "--out", out])
    assert rc == 0, output
    _assert_identical_runs(reference, out)
    KILL_POINTS.append(("after-log:3 then checkpoint-write:4", 2, True))


def test_kill_point_tally(capsys):
    tried = sum(k for _, k, _ in KILL_POINTS)
    exact = sum(k for _, k, ok in KILL_POINTS if ok)
    with capsys.disabled():
        print(f"\nresume after SIGKILL: {exact}/{tried} kill points bit-exact "
              f"({len(KILL_POINTS)} scenarios)")
    assert exact == tried


# ------------------------------------------------------------------ operator faults (in-process)


@pytest.fixture
def saved_run(tmp_path):
    """A run directory as a run killed before its first checkpoint leaves it."""
    out = tmp_path / "run"
    out.mkdir()
    cfg = vars(parse_args([*RUN, "--out", str(out)]))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_resume_with_nothing_to_resume_is_refused(tmp_path):
    with pytest.raises(ValueError, match="nothing to resume.*config.json does not exist"):
        parse_args(["--resume", "--out", str(tmp_path / "none")])


def test_resume_uses_the_saved_configuration(saved_run, tmp_path, monkeypatch):
    cfg = parse_args(["--resume", "--out", str(saved_run)])
    assert cfg.model == "qwen2-micro" and cfg.steps == 5 and cfg.resume
    monkeypatch.chdir(tmp_path)
    assert parse_args(["--resume", "--out", "run/"]).out == "run/"


def test_resume_refuses_changes_from_a_config_file_like_flags(saved_run, tmp_path):
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps({"estimator": "grpo"}))
    with pytest.raises(ValueError, match="estimator 'grpo' in the --config file differs"):
        parse_args(["--resume", "--out", str(saved_run), "--config", str(changed)])
    toml = tmp_path / "k.toml"
    toml.write_text("k = 3\n")
    with pytest.raises(ValueError, match="--k 3 in the --config file differs"):
        parse_args(["--resume", "--out", str(saved_run), "--config", str(toml)])
    with pytest.raises(ValueError, match="--seed 7 differs"):
        parse_args(["--resume", "--out", str(saved_run), "--seed", "7"])
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"estimator": "maxk_loo1", "k": 2, "steps": 9}))
    cfg = parse_args(["--resume", "--out", str(saved_run), "--config", str(same)])
    assert cfg.steps == 9 and cfg.k == 2


def test_damaged_checkpoint_is_named_with_what_to_do(saved_run):
    path = saved_run / "checkpoint.pt"
    for content in (b"", b"PK\x03\x04 truncated"):
        path.write_bytes(content)
        with pytest.raises(ckpt.CheckpointError, match="checkpoint.pt cannot be resumed from.*"
                                                       "delete it and run --resume again"):
            main(["--resume", "--out", str(saved_run)])


def test_stale_temporary_files_are_removed(saved_run):
    (saved_run / ".checkpoint.pt.abc123").write_bytes(b"half")
    (saved_run / ".metrics.jsonl.x").write_bytes(b"")
    (saved_run / "keep.txt").write_text("mine")
    assert ckpt.remove_stale_temp_files(str(saved_run), ("checkpoint.pt", "metrics.jsonl")) == [
        ".checkpoint.pt.abc123", ".metrics.jsonl.x"]
    assert sorted(os.listdir(saved_run)) == ["config.json", "keep.txt"]


def test_torn_metrics_line_is_dropped_with_a_warning(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "train", "step": 2}\n{"kind": "tr')
    log = MetricsLog(str(path), True)
    assert [r["step"] for r in log.read()] == [1, 2]
    assert "dropped its torn last line 3" in capsys.readouterr().err
    log.truncate_after(1)
    assert path.read_text() == '{"kind": "train", "step": 1}\n'
    path.write_text('{"kind": "train", "step": 1}\n{"kind": \n{"kind": "train", "step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl, line 2"):
        log.read()
