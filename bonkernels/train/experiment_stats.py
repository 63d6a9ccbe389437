"""Statistics of the pass@k experiment: per-prompt metrics, paired tests over prompts and seeds.

Every run of the experiment evaluates the same held-out prompts, and the runs of one seed share
their evaluation's sampling seed, so two arms' results are *paired* by prompt (and by seed). The
comparisons here use that pairing:

* ``per_prompt``: the unbiased per-prompt estimate of pass@k (all hidden tests passed) or max@k
  (the continuous reward) from one evaluation's [prompts, eval_n] reward table;
* ``paired_bootstrap``: the mean difference of two arms (arrays [seeds, prompts]), with a
  percentile confidence interval and a two-sided p-value from resampling prompts and seeds
  (the same resampled indices for both arms: the pairing is kept);
* ``sign_flip_test``: a randomisation test of the per-prompt differences (averaged over seeds),
  which needs no distributional assumption;
* ``holm``: Holm's step-down adjustment of p-values when several arms are tested for one claim.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def metric_names(eval_n: int) -> list[str]:
    return [f"{kind}@{k}" for kind in ("pass", "max") for k in range(1, eval_n + 1)]


def per_prompt(rewards, metric: str) -> np.ndarray:
    """[P, n] rewards (fractions in [0, 1]) -> [P] per-prompt estimates of ``metric``:
    "pass@k" (unbiased, a completion is correct when its reward is 1), "max@k" (unbiased), or
    "reward_mean"."""
    import bonkernels as bk

    table = torch.as_tensor(np.asarray(rewards, dtype=np.float64))
    if table.ndim != 2:
        raise ValueError(f"expected a [prompts, samples] reward table, got shape {tuple(table.shape)}")
    if metric == "reward_mean":
        return table.mean(1).numpy()
    kind, _, k = metric.partition("@")
    k = int(k)
    if kind == "pass":
        return bk.pass_at_k((table >= 1.0).to(torch.float64), k).numpy()
    if kind == "max":
        return bk.max_at_k(table, k).numpy()
    raise ValueError(f"unknown metric {metric!r}: pass@k, max@k or reward_mean")


def _as_2d(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x[None, :] if x.ndim == 1 else x


def paired_bootstrap(a, b, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                     pair_seeds: bool = True, resample_seeds: bool = True) -> dict:
    """Mean of a - b over seeds and prompts, bootstrapped over prompts and seeds.

    a, b: [S_a, P] and [S_b, P] (or [P]) per-prompt values of two arms on the same P prompts.
    Prompts are resampled with the same indices for both (the pairing by prompt); seeds are
    resampled too (unless ``resample_seeds`` is false), with the same indices for both when
    ``pair_seeds`` and S_a == S_b (the runs of one seed share the evaluation's sampling seed),
    independently otherwise. Resampling both prompts and seeds counts the prompt-by-seed noise
    twice, so the interval is somewhat conservative (wider) rather than optimistic; with prompts
    only it covers the evaluation's noise given these training runs. Returns diff (the
    observed mean difference), se (the bootstrap standard deviation), lo/hi (percentile interval
    at ``level``), p (two-sided: twice the smaller tail of the bootstrap distribution beyond 0,
    at least 1/n_boot), n_prompts, n_seeds_a, n_seeds_b.
    """
    a, b = _as_2d(a), _as_2d(b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two arms have different numbers of prompts: {a.shape[1]} vs {b.shape[1]}")
    sa, P = a.shape
    sb = b.shape[0]
    rng = np.random.default_rng(seed)
    diff = float(a.mean() - b.mean())
    prompts = rng.integers(0, P, size=(n_boot, P))
    seeds_a = (rng.integers(0, sa, size=(n_boot, sa)) if resample_seeds
               else np.broadcast_to(np.arange(sa), (n_boot, sa)))
    paired = pair_seeds and sa == sb
    seeds_b = seeds_a if paired else (rng.integers(0, sb, size=(n_boot, sb)) if resample_seeds
                                      else np.broadcast_to(np.arange(sb), (n_boot, sb)))
    # per resample: mean over resampled seeds of the mean over resampled prompts
    pa = np.stack([a[:, idx].mean(1) for idx in prompts])          # [n_boot, S_a]
    pb = np.stack([b[:, idx].mean(1) for idx in prompts])          # [n_boot, S_b]
    boots = (np.take_along_axis(pa, seeds_a, 1).mean(1)
             - np.take_along_axis(pb, seeds_b, 1).mean(1))
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    ties = float(np.mean(boots == 0.0))  # discrete metrics: resamples with no difference at all
    tail = min(float(np.mean(boots < 0.0)), float(np.mean(boots > 0.0))) + ties / 2
    p = min(1.0, max(2.0 * tail, 1.0 / n_boot))
    return {"diff": diff, "se": float(boots.std(ddof=1)), "lo": float(lo), "hi": float(hi),
            "p": p, "level": level, "n_boot": n_boot, "n_prompts": P, "n_seeds_a": sa,
            "n_seeds_b": sb}


def sign_flip_test(a, b, *, n_perm: int = 5000, seed: int = 0) -> dict:
    """Paired randomisation test over prompts: d_p = mean over seeds of a minus that of b; under
    the null of no difference each d_p is as likely to have either sign. Returns diff, p
    (two-sided, with the +1 correction so it is never 0), n_prompts."""
    a, b = _as_2d(a), _as_2d(b)
    d = a.mean(0) - b.mean(0)
    observed = abs(float(d.mean()))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, d.size))
    null = np.abs((signs * d).mean(1))
    p = (1 + int(np.sum(null >= observed - 1e-15))) / (n_perm + 1)
    return {"diff": float(d.mean()), "p": p, "n_prompts": int(d.size)}


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment: {name: p} -> {name: adjusted p} (family-wise error)."""
    order = sorted(pvalues, key=lambda name: pvalues[name])
    m = len(order)
    out, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[name]))
        out[name] = running
    return out


def mean_sd(values) -> tuple[float, float]:
    values = [float(v) for v in values]
    if not values:
        return math.nan, math.nan
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def first_crossing(xs, ys, target: float):
    """The smallest x at which the piecewise-linear curve (xs, ys) reaches ``target`` (linear
    interpolation between the two points around the first crossing), or None if it never does."""
    pts = list(zip(xs, ys))
    if not pts:
        return None
    if pts[0][1] >= target:
        return float(pts[0][0])
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if y1 >= target:
            return float(x0 + (x1 - x0) * (target - y0) / (y1 - y0))
    return None
