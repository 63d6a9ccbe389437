"""Rewards the training step can always use: finite numbers in [0, 1], whatever a task returns.

A completion must never be able to stop training or push a reward out of range: a task that
raises, returns the wrong number of values, a value that is not a number, non-finite or outside
[0, 1] gives 0 (or the clamped value) for those completions, and the reason is counted.
"""

from __future__ import annotations

import math
from collections import Counter


def safe_rewards(task, problems, completions) -> tuple[list[float], Counter]:
    """(rewards, reasons): ``task.rewards`` made total; reasons counts every repaired value."""
    reasons = Counter()
    before = Counter(getattr(task, "unscored", {}) or {})
    try:
        values = list(task.rewards(problems, completions))
    except Exception as e:  # a task bug or a hostile completion: the step goes on with zeros
        reasons[f"task-error:{type(e).__name__}"] += len(completions)
        return [0.0] * len(completions), reasons
    if len(values) != len(completions):
        reasons["wrong-count"] += len(completions)
        return [0.0] * len(completions), reasons
    out = []
    for value in values:
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            reasons["not-a-number"] += 1
            out.append(0.0)
            continue
        if not math.isfinite(x):
            reasons["non-finite"] += 1
            x = 0.0
        elif not 0.0 <= x <= 1.0:
            reasons["out-of-range"] += 1
            x = min(1.0, max(0.0, x))
        out.append(x)
    after = Counter(getattr(task, "unscored", {}) or {})
    reasons.update(after - before)  # the task's own count of completions it could not score
    return out, reasons
