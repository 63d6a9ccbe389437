"""The estimator registry: one entry per estimator, with the facts dispatch and validation need.

This is the one place that lists the estimators. The mathematics lives in ``docs/spec.md`` (the
section of each estimator is its ``spec`` field) and in ``reference.py`` (the specification in
code); this module only says, for each name, what the estimator needs. Everything else reads it:
``bonkernels/_codegen.py`` generates the native kernels' header ``estimator_facts.h`` from it,
``bonkernels/triton/_facts.py`` hands its codes to the Triton kernel, ``bonkernels/tables.py``
derives the mixture lists, and ``python_tests/test_estimator_facts.py`` checks every backend that
claims an estimator against the reference (see ``docs/adding-an-estimator.md``).

Fields of :class:`Estimator`:

* ``code``: the stable integer id passed to the native and Triton kernels.
* ``scale``: the scale the spec's formula gives ("sum": grad = sum_i A_i grad log p_i;
  "mean": the advantage a loss that averages over samples uses). ``scale="mean"`` output is always
  ``n_g * (scale="sum" output)``.
* ``uses_k``: False when k is ignored (no k-versus-group-size check at all).
* ``k_margin``: the largest valid k is ``n - k_margin`` (1 for the leave-one-out estimators
  ``maxk_loo`` and ``maxk_loo_centered``, which need a k-subset that avoids sample i).
* ``needs_deltas``: the off-policy estimators take ``deltas`` (pi_theta/pi_old - 1 per sample);
  every other estimator rejects them.
* ``binary``: rewards must be exactly 0 or 1.
* ``non_negative``: rewards must be >= 0 (``maxrl`` divides by the group mean).
* ``default_clip``: the clip applied when the caller passes ``clip=None`` (``bon_rlb``, whose
  weights are infinite for an all-fail group); None: no clip.
* ``unbiased``: the spec calls the estimator unbiased for grad max@k (pass@k for binary rewards).
* ``order_free``: the formula uses only group reductions and the sample's own value, so the
  kernels skip the sort.
* ``centred``: order-free, and the reductions are the group's mean (and spread) alone: no
  maximum, no sort, no tables. The kernels give these estimators their own, lighter code paths
  (the native kernels' centred set and vector packs, the Triton kernel's widest lanes).
* ``linear_in_tables``: the weights are linear in the weight tables d, o, q, so a mixture over
  k (``k_weights``) is exact for the estimator (spec 12).
* ``one_pass``: linear in its tables, and from a bank its weights are rank tables times the sorted
  rewards summed in one direction (maxk_offpolicy's with the deltas' prefix sum): one pass over
  the sorted group computes them. The Triton lane kernels then go through a group a column at a
  time. The CPU pack executor's sorted packs and the CUDA kWide and kWideOffPolicy sets take
  the same calls, and their builds fail where their lists differ from this field.
* ``backends``: the backends that implement the estimator (the reference, ``"torch"``, implements
  every one).
* ``spec``: the section of ``docs/spec.md`` that defines the estimator (a test checks that it is
  a heading there).
* ``summary``: one line, also written into the generated header's enum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

# Every backend a registry entry can name; "auto" is a choice among them, not a backend.
ALL_BACKENDS = ("torch", "cpu", "cuda", "triton")


@dataclass(frozen=True)
class Estimator:
    name: str
    code: int
    scale: str
    uses_k: bool = True
    k_margin: int = 0
    needs_deltas: bool = False
    binary: bool = False
    non_negative: bool = False
    unbiased: bool = False
    order_free: bool = False
    centred: bool = False
    linear_in_tables: bool = False
    one_pass: bool = False
    backends: Tuple[str, ...] = ALL_BACKENDS
    spec: str = ""
    summary: str = ""
    default_clip: Optional[Tuple[float, float]] = None


# bon_rlb's weights are infinite for a group where every sample fails (p_hat = 1); Chow et al.
# clip them. With clip=None this symmetric default applies (to the output, in the chosen scale).
# Finite mean-scale values grow like n * k (one success in n: about n k), so the bound sits well
# above them for the usual n <= 16, k <= 8 and only caps the all-fail groups.
BON_RLB_DEFAULT_CLIP = (-100.0, 100.0)


_ENTRIES = (
    Estimator("maxk", 0, "sum", unbiased=True, linear_in_tables=True, one_pass=True, spec="2.2",
              summary="PKPO s_i = Bagirov on-policy max@k weights"),
    Estimator("maxk_loo", 1, "sum", k_margin=1, unbiased=True, linear_in_tables=True, spec="2.3",
              summary="PKPO s^(loo), as in the paper (not centered)"),
    Estimator("maxk_loo_centered", 2, "sum", k_margin=1, unbiased=True, linear_in_tables=True, spec="2.3",
              summary="centered leave-one-out: s_i - (k/n) max@k(others)"),
    Estimator("maxk_loo1", 3, "sum", unbiased=True, linear_in_tables=True, one_pass=True, spec="2.4",
              summary="PKPO s^(loo-1); k = 1: (g_i - mean of others)/n"),
    Estimator("maxk_offpolicy", 4, "sum", needs_deltas=True, linear_in_tables=True, one_pass=True, spec="3.2",
              summary="Bagirov first-order off-policy max@k weights"),
    Estimator("maxk_offpolicy_exact", 5, "sum", needs_deltas=True, unbiased=True, linear_in_tables=True,
              backends=("torch",), spec="3.4",
              summary="exact product-of-ratios off-policy max@k weights"),
    Estimator("passk", 6, "sum", binary=True, unbiased=True, linear_in_tables=True, one_pass=True, spec="2.1",
              summary="PKPO binary effective rewards"),
    Estimator("tang_loo", 7, "sum", uses_k=False, unbiased=True, spec="5",
              summary="max - max of the others (the k = n case)"),
    Estimator("bon_max_mean", 8, "mean", uses_k=False, order_free=True, spec="3.3",
              summary="g_i - mean(g) at the argmax set, else 0"),
    Estimator("bon_max_second", 9, "mean", uses_k=False, order_free=True, spec="3.3",
              summary="g_i - second distinct value at the argmax set, else 0"),
    Estimator("bon_mean", 10, "mean", spec="3.3",
              summary="z-score of the max@k weights s_i"),
    Estimator("chen_passk", 11, "mean", binary=True, spec="6",
              summary="Chen et al. analytic pass@k advantage"),
    Estimator("bon_rlb", 12, "mean", binary=True, spec="4", default_clip=BON_RLB_DEFAULT_CLIP,
              summary="Chow et al. BoN-RLB, two-sided, clipped"),
    Estimator("bon_rlb_pos", 13, "mean", binary=True, spec="4",
              summary="Chow et al. BoN-RLB(P), positive samples only"),
    Estimator("grpo", 14, "mean", uses_k=False, order_free=True, centred=True, spec="13.1",
              summary="(g_i - mean) / (sample std + eps)"),
    Estimator("rloo", 15, "mean", uses_k=False, order_free=True, centred=True, unbiased=True,
              spec="13.2",
              summary="g_i - mean of the others"),
    Estimator("dr_grpo", 16, "mean", uses_k=False, order_free=True, centred=True, spec="13.3",
              summary="g_i - group mean"),
    Estimator("maxrl", 17, "mean", uses_k=False, order_free=True, centred=True, non_negative=True,
              spec="12.2",
              summary="MaxRL: (r_i - mean) / mean, 0 when the mean is 0"),
)

REGISTRY = {e.name: e for e in _ENTRIES}
ESTIMATORS = tuple(e.name for e in _ENTRIES)

# Relative tolerance below which bon_mean treats its s_i as constant (spec 3.3 hazard note):
# z-scoring exactly-equal values would otherwise amplify rounding noise by 1/eps.
ZSCORE_CONSTANT_RTOL = 1e-10

SMALL_GROUP_MODES = ("error", "zero", "clamp")


def get(name: str) -> Estimator:
    """Look an estimator up by name, with a clear error listing the valid names."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; valid estimators: {', '.join(ESTIMATORS)}")
    return REGISTRY[name]


BY_CODE = {e.code: e for e in _ENTRIES}


def by_code(code: int) -> Estimator:
    """The estimator with a given kernel code."""
    return BY_CODE[int(code)]


def _check_registry() -> None:
    """The registry's own consistency rules, checked at import (a bad entry fails every import)."""
    names = [e.name for e in _ENTRIES]
    codes = [e.code for e in _ENTRIES]
    assert len(set(names)) == len(names), "estimator names must be unique"
    assert len(set(codes)) == len(codes), "estimator codes must be unique"
    for e in _ENTRIES:
        assert e.name.isidentifier() and e.name == e.name.lower(), e.name
        assert isinstance(e.code, int) and e.code >= 0, e.name
        assert e.scale in ("sum", "mean"), e.name
        assert e.k_margin in (0, 1) and (e.uses_k or e.k_margin == 0), e.name
        assert "torch" in e.backends and set(e.backends) <= set(ALL_BACKENDS), e.name
        assert not (e.linear_in_tables and not e.uses_k), e.name
        assert not e.centred or (e.order_free and not e.uses_k and not e.needs_deltas), e.name
        assert not e.one_pass or (e.linear_in_tables and e.k_margin == 0), e.name
        assert e.spec and e.summary, e.name
        assert e.default_clip is None or (len(e.default_clip) == 2 and e.default_clip[0] <= e.default_clip[1]), e.name


_check_registry()
