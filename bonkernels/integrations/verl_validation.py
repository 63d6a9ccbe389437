"""Unbiased pass@k / max@k in verl's validation metrics.

verl reports ``best@k`` by a bootstrap: k of a prompt's n samples drawn with replacement, the best
kept, 1000 times. That estimate is biased low (one correct sample in four gives best@4 near
1 - (3/4)^4 = 0.68, not 1). :func:`process_validation_metrics` has verl's signature, returns verl's
own metrics and adds, per data source and reward variable, the unbiased ``pass@k`` (0/1 variables
such as ``acc``), ``max@k`` and, with k weights, ``max_mix@T`` / ``pass_mix@T``
(``bonkernels.integrations.metrics``). verl logs them under ``val-aux/<data source>/<var>/``.

Switch a verl run over in the process that runs the trainer::

    import bonkernels.integrations.verl_validation as bk_val
    bk_val.install(ks=[1, 4, 16])          # k weights: install(k_weights=[...]); default ks: 1, 2, 4, ..., n

Groups smaller than a k use k = the group's size (``small_groups="clamp"``) so that a partly failed
validation prompt never stops a run; pass ``small_groups="error"`` to be told instead.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from typing import Optional, Sequence

from .metrics import largest_k, per_group_metrics

_SETTINGS = {"ks": None, "k_weights": None, "small_groups": "clamp"}


def unbiased_metrics(data_sources, sample_uids, infos_dict, *, ks: Optional[Sequence[int]] = None,
                     k_weights: Optional[Sequence[float]] = None, small_groups: str = "clamp") -> dict:
    """``{data_source: {var: {"pass@k" | "max@k" | "max_mix@T": value}}}`` from verl's validation lists.

    Each variable's values are grouped by (data source, uid); ``None`` and string values are
    skipped, as verl does. ``pass@k`` is reported for variables whose values are all 0/1 (or bool).
    A k (or k weights up to T) above the largest group of a variable is not reported for it.
    """
    rows = defaultdict(lambda: defaultdict(lambda: ([], [])))   # source -> var -> (values, uids)
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        for var, values in infos_dict.items():
            value = values[i]
            if value is None or isinstance(value, str):
                continue
            try:
                value = float(value)
            except (TypeError, ValueError):
                continue
            vals, uids = rows[source][var]
            vals.append(value)
            uids.append(str(uid))
    out = {}
    for source, per_var in rows.items():
        for var, (vals, uids) in per_var.items():
            # k above the largest group is not estimable, and a name with k above verl's own largest
            # would move verl's headline metrics out of its val-core section: leave those out
            largest = max(Counter(uids).values())
            ks_here = None if ks is None else [k for k in ks if k <= largest]
            if ks_here == []:
                continue
            weights = k_weights if k_weights is not None and largest_k(k_weights) <= largest else None
            per_group = per_group_metrics(vals, uids, ks_here, k_weights=weights, small_groups=small_groups)
            out.setdefault(source, {})[var] = {name: float(v.double().mean()) for name, v in per_group.items()}
    return out


def process_validation_metrics(data_sources, sample_uids, infos_dict, seed: int = 42, *args, **kwargs):
    """verl's ``process_validation_metrics`` plus the unbiased metrics (same nested structure)."""
    result = _verl_original()(data_sources, sample_uids, infos_dict, seed, *args, **kwargs)
    extra = unbiased_metrics(data_sources, sample_uids, infos_dict, ks=_SETTINGS["ks"],
                             k_weights=_SETTINGS["k_weights"], small_groups=_SETTINGS["small_groups"])
    for source, per_var in extra.items():
        for var, metrics in per_var.items():
            result[source][var].update(metrics)
    return result


def _verl_original():
    from verl.trainer.ppo import metric_utils

    fn = metric_utils.process_validation_metrics
    return getattr(fn, "bk_wraps", fn)


def install(ks: Optional[Sequence[int]] = None, k_weights: Optional[Sequence[float]] = None,
            small_groups: str = "clamp") -> None:
    """Make verl's trainer log the unbiased metrics (replaces the name its validation step calls).

    Call it before verl's trainer module is imported, or after: both names are replaced.
    """
    from verl.trainer.ppo import metric_utils

    if small_groups not in ("error", "clamp", "zero"):
        raise ValueError(f"small_groups must be 'error', 'clamp' or 'zero', got {small_groups!r}")
    _SETTINGS.update(ks=None if ks is None else [int(k) for k in ks],
                     k_weights=None if k_weights is None else list(k_weights), small_groups=small_groups)
    process_validation_metrics.bk_wraps = _verl_original()
    metric_utils.process_validation_metrics = process_validation_metrics
    trainer_module = sys.modules.get("verl.trainer.ppo.ray_trainer")   # imported the name already
    if trainer_module is not None:
        trainer_module.process_validation_metrics = process_validation_metrics
