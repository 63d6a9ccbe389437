"""pytest-benchmark suite: ``pytest bench/ --benchmark-only`` (not part of ``pytest python_tests``).

A few representative cells, every available method on the same inputs. The full sweep with
recorded results and plots is ``python -m bench`` (bench/run.py); this suite is for quick,
comparable numbers in pytest-benchmark's own format (``--benchmark-compare``, ``--benchmark-json``).
"""

from __future__ import annotations

import pytest
import torch

from bench import methods

CELLS = [  # (estimator, G, n, k)
    ("maxk_loo1", 1024, 16, 4),
    ("maxk_offpolicy", 1024, 16, 4),
    ("maxk_offpolicy", 16, 256, 128),
    ("grpo", 1024, 16, 1),
]
# Rounds per method: the Python-loop baselines take seconds where the kernels take microseconds.
ROUNDS = {"pkpo_listing": 3, "verl_loop": 3, "maxk_matrix": 5, "pkpo_listing_cached": 5}

_DEVICE = torch.device("cpu")
_METHODS = {m.name: m for m in methods.backend_methods(_DEVICE) + methods.baseline_methods()}


def _params():
    for est, G, n, k in CELLS:
        for name, m in _METHODS.items():
            if est in m.estimators:
                yield pytest.param(name, est, G, n, k, id=f"{est}-G{G}-n{n}-k{k}-{name}")


@pytest.mark.parametrize("method,estimator,G,n,k", list(_params()))
def test_advantages(benchmark, method, estimator, G, n, k):
    m = _METHODS[method]
    if not m.available:
        pytest.skip(f"{method}: {m.why_unavailable}")
    torch.set_num_threads(2)
    inputs = methods.make_inputs(G, n, k, estimator, _DEVICE)
    fn = m.build(inputs)
    ref = methods._backend_call("torch")(inputs)().reshape(-1)
    err = (fn().reshape(-1).double() - ref.double()).abs().max() / ref.double().abs().max()
    assert err < 1e-5, f"{method} differs from the reference by {err:.1e} (relative to max |A|)"
    benchmark.group = f"{estimator} G={G} n={n} k={k}"
    benchmark.extra_info.update(G=G, n=n, k=k, samples=G * n)
    if method in ROUNDS:
        benchmark.pedantic(fn, rounds=ROUNDS[method], warmup_rounds=1)
    else:
        benchmark(fn)
