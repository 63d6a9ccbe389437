"""Two processes on CPU (gloo) with torchrun: groups stay whole on a rank, gradients are averaged,
every rank ends with the same weights (the driver checks and raises otherwise), resume works, and
the processes shut down without an abort."""

import json
import os
import subprocess
import sys
import threading
import time

import torch

from bonkernels.train import checkpoint as ckpt
from bonkernels.train.distributed import _Handoffs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _torchrun(args, target=("-m", "bonkernels.train")):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *target, *args]
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


def test_collectives_and_clean_shutdown():
    r = _torchrun([], target=(os.path.join(REPO, "python_tests", "dist_worker.py"),))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "rank 0: collectives ok" in r.stdout and "rank 1: collectives ok" in r.stdout
    assert "terminate called" not in r.stderr


def test_handoffs_wait_for_the_last_holder():
    handoffs = _Handoffs()
    t, u = handoffs.track(torch.zeros(3)), handoffs.track(torch.ones(2))
    # a view refers to its base from C++, as a collective's work does: dropping the Python
    # name must not count as a release while that reference lives
    held_by_cpp = t.view(3)
    del t
    assert handoffs.pending() == 2
    assert not handoffs.wait_released(timeout=0.05)
    del held_by_cpp
    assert handoffs.pending() == 1
    cycle = [u]
    cycle.append(cycle)  # freed only by the garbage collector, which wait_released runs
    del u, cycle
    assert handoffs.wait_released(timeout=5.0)
    assert handoffs.pending() == 0


def test_handoffs_wait_for_a_release_on_another_thread():
    """As a gloo worker thread does: the holder lets go later, on its own thread, while close()
    waits (without the GIL, or the holder could never run)."""
    handoffs = _Handoffs()
    t = handoffs.track(torch.zeros(4))
    box = [t]
    del t

    def release_later():
        time.sleep(0.3)
        box.clear()  # the last reference goes here, so the finalizer runs on this thread

    worker = threading.Thread(target=release_later)
    start = time.monotonic()
    worker.start()
    assert handoffs.wait_released(timeout=10.0)
    assert time.monotonic() - start >= 0.25 and handoffs.pending() == 0
    worker.join()

