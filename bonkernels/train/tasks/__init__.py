"""Tasks: where prompts come from and how completions are scored.

A task provides
* ``problem(split, index) -> Problem``: deterministic for a given task seed; splits are "train",
  "eval" and "sft" (the warm-start data);
* ``rewards(problems, completions) -> list[float]``: the fraction of hidden tests passed, in [0, 1]
  (1.0 means every test passed: that is what pass@k counts);
* ``max_new_tokens`` and ``stop_texts`` (generation stops at eos; text after a stop text is cut
  before scoring);
* ``num_problems(split)``: how many distinct problems a split has (None: unbounded).
"""

from __future__ import annotations

from .problem import Problem, truncate_at_stop  # noqa: F401  (the tasks' shared types)


TASKS = ("synth", "humaneval")


def make_task(name: str, *, seed: int = 1234, sandbox_timeout: float = 5.0, workers: int = 2,
              synth_depth_weights=None):
    """Build a task by name."""
    if name == "synth":
        from .synth import SynthTask

        if synth_depth_weights is None:
            return SynthTask(seed=seed)
        return SynthTask(seed=seed, depth_weights=synth_depth_weights)
    if name == "humaneval":
        from .humaneval import HumanEvalTask

        return HumanEvalTask(timeout=sandbox_timeout, workers=workers)
    raise ValueError(f"unknown task {name!r}; choose one of {TASKS}")
