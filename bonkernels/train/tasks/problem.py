"""What every task shares: the Problem record and the stop-text rule (imported by the task
modules and re-exported by the package, so neither imports the other's package)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    key: str
    prompt: str
    solution: str | None = None  # a reference completion, for the supervised warm start
    data: dict = field(default_factory=dict, compare=False, hash=False)


def truncate_at_stop(text: str, stop_texts) -> str:
    """Cut text at the first occurrence of any stop text."""
    cut = len(text)
    for stop in stop_texts:
        pos = text.find(stop)
        if pos != -1:
            cut = min(cut, pos)
    return text[:cut]
