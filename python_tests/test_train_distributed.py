"""Two processes on CPU (gloo) with torchrun: groups stay whole on a rank, gradients are averaged,
every rank ends with the same weights (the driver checks and raises otherwise), resume works."""

import json
import os
import subprocess
import sys

from bonkernels.train import checkpoint as ckpt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torchrun(args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "bonkernels.train", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_two_process_data_parallel_run(tmp_path):
    out = str(tmp_path / "ddp")
    args = ["--model", "qwen2-micro", "--warmstart-steps", "2", "--warmstart-batch-size", "8",
            "--group-size", "4", "--k", "2", "--batch-size", "4", "--eval-problems", "4", "--eval-n", "4",
            "--eval-every", "2", "--steps", "2", "--threads", "1", "--progress", "off",
            "--no-plots", "--no-export", "--out", out, "--estimator", "maxk_loo1"]
    r = _torchrun(args)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "2 process(es)" in r.stdout
    state = ckpt.load(os.path.join(out, "checkpoint.pt"))
    assert state["world_size"] == 2 and state["step"] == 2 and len(state["rng"]) == 2
    # each rank sampled with its own RNG stream
    assert not all(a == b for a, b in zip(state["rng"][0]["torch"].tolist(),
                                          state["rng"][1]["torch"].tolist()))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    evals = [x for x in records if x["kind"] == "eval"]
    assert [e["num_prompts"] for e in evals] == [4, 4]  # eval prompts split and gathered
    # resume the 2-process run for one more step
    r = _torchrun(["--resume", "--out", out, "--steps", "3", "--progress", "off"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert ckpt.load(os.path.join(out, "checkpoint.pt"))["step"] == 3
