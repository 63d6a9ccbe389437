"""The estimator facts the Triton backend needs, read from the registry (bonkernels/estimators.py).

Pure Python (no triton import). The kernel's estimator codes and the launcher's per-launch facts
(k rule, natural scale, deltas, bank mode) all come through these few functions, so the registry
stays the only list of estimators and a change to its fields is adapted here, in one place.
Every answer is a registry field; nothing here is kept by hand.
"""

from __future__ import annotations

from typing import Optional

from .. import estimators


def get(name: str) -> estimators.Estimator:
    return estimators.get(name)


def code(name: str) -> int:
    """The kernel code of an estimator."""
    return get(name).code


def by_code(estimator_code: int) -> Optional[estimators.Estimator]:
    """The estimator with this code, or None."""
    return estimators.BY_CODE.get(int(estimator_code))


def in_kernel(est: estimators.Estimator) -> bool:
    """Whether the Triton kernel implements the estimator."""
    return "triton" in est.backends


def natural_mean(est: estimators.Estimator) -> bool:
    """True when the estimator's formula gives mean-scale values."""
    return est.scale == "mean"


def linear_in_tables(est: estimators.Estimator) -> bool:
    """True when a mixture over k is a mixture of the estimator's tables (bank mode)."""
    return est.linear_in_tables


def kernel_estimators() -> list:
    """Every estimator the kernel implements, in code order."""
    return sorted((e for e in estimators.REGISTRY.values() if in_kernel(e)), key=lambda e: e.code)
