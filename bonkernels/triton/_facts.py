"""The estimator facts the Triton backend needs, read from the registry (bonkernels/estimators.py).

Pure Python (no triton import). The kernel's estimator codes and the launcher's per-launch facts
(k rule, natural scale, deltas, bank mode) all come through these few functions, so the registry
stays the only list of estimators and a change to its fields is adapted here, in one place.
"""

from __future__ import annotations

from typing import Optional

from .. import estimators

# Estimators the kernel implements before their registry line exists, with the facts that line will
# hold (a registry entry of the same name always wins).
_AHEAD_OF_REGISTRY = (
    estimators.Estimator("maxrl", 17, "mean", uses_k=False, spec="12",
                         summary="MaxRL: (r_i - mean) / mean, 0 when the mean is 0"),
)

# Estimators whose values are linear in their weight tables (spec 12): with k weights they read
# the mixed tables from a bank instead of building single-k tables.
_LINEAR_IN_TABLES = ("maxk", "passk", "maxk_loo", "maxk_loo_centered", "maxk_loo1",
                     "maxk_offpolicy")

# Estimators the Triton kernel has no branch for (refused by the launcher).
_NOT_IN_KERNEL = ("maxk_offpolicy_exact",)


def _all() -> dict:
    merged = {e.name: e for e in _AHEAD_OF_REGISTRY}
    merged.update(estimators.REGISTRY)
    return merged


def get(name: str) -> estimators.Estimator:
    return _all()[name]


def code(name: str) -> int:
    """The kernel code of an estimator."""
    return get(name).code


def by_code(estimator_code: int) -> Optional[estimators.Estimator]:
    """The estimator with this code, or None."""
    for e in _all().values():
        if e.code == int(estimator_code):
            return e
    return None


def in_kernel(est: estimators.Estimator) -> bool:
    """Whether the Triton kernel implements the estimator."""
    backends = getattr(est, "backends", None)
    if backends is not None:
        return "triton" in backends
    return est.name not in _NOT_IN_KERNEL


def natural_mean(est: estimators.Estimator) -> bool:
    """True when the estimator's formula gives mean-scale values."""
    return est.scale == "mean"


def linear_in_tables(est: estimators.Estimator) -> bool:
    """True when a mixture over k is a mixture of the estimator's tables (bank mode)."""
    return bool(getattr(est, "linear_in_tables", est.name in _LINEAR_IN_TABLES))


def kernel_estimators() -> list:
    """Every estimator the kernel implements, in code order."""
    return sorted((e for e in _all().values() if in_kernel(e)), key=lambda e: e.code)
