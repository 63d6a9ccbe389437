"""Mixtures over k and maxrl on every backend: each against the reference, and a mixture against the
weighted sum of the same backend's single-k calls (linearity, up to rounding).

The kernels read the table bank (bonkernels/tables.py) through their ``bank=`` argument.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import bonkernels as bk
from bonkernels import _native

LINEAR = ("maxk", "passk", "maxk_loo", "maxk_loo_centered", "maxk_loo1", "maxk_offpolicy")
WEIGHTS = (0.5, 0.0, 1.0, 0.25, 0.125)


def _inputs(estimator, device="cpu", dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = [8, 1, 5, 16, 0, 3, 33, 2, 64, 7]
    offsets = torch.tensor([0] + [int(s) for s in torch.tensor(sizes).cumsum(0)], dtype=torch.int64)
    r = torch.rand(int(offsets[-1]), generator=g, dtype=torch.float64)
    if estimator == "passk":
        r = (r > 0.6).to(torch.float64)
    kw = {"offsets": offsets.to(device), "small_groups": "clamp"}
    if estimator == "maxk_offpolicy":
        kw["deltas"] = (0.1 * torch.rand(r.shape, generator=g, dtype=torch.float64) - 0.05).to(device, dtype)
    return r.to(device, dtype), kw


def _check_backend(backend, device="cpu"):
    for estimator in LINEAR:
        r, kw = _inputs(estimator, device)
        for scale in ("sum", "mean"):
            mixed = bk.advantages(r, estimator=estimator, k_weights=WEIGHTS, backend=backend, scale=scale, **kw)
            ref = bk.advantages(r.cpu(), estimator=estimator, k_weights=WEIGHTS, backend="torch", scale=scale,
                                **{k: v.cpu() for k, v in kw.items() if torch.is_tensor(v)},
                                small_groups="clamp")
            summed = sum(w * bk.advantages(r, k, estimator, backend=backend, scale=scale, **kw)
                         for k, w in enumerate(WEIGHTS, start=1) if w)
            assert torch.allclose(mixed.cpu(), ref, rtol=1e-12, atol=1e-13), (backend, estimator, scale)
            assert torch.allclose(mixed, summed, rtol=1e-12, atol=1e-13), (backend, estimator, scale)


def _check_maxrl(backend, device="cpu"):
    g = torch.Generator().manual_seed(3)
    r = torch.rand(37, generator=g, dtype=torch.float64)
    r[:8] = (r[:8] > 0.5).to(torch.float64)
    r[8:12] = 0.0
    offsets = torch.tensor([0, 8, 12, 13, 20, 37])
    for scale in ("sum", "mean"):
        ours = bk.advantages(r.to(device), estimator="maxrl", offsets=offsets.to(device), backend=backend, scale=scale)
        ref = bk.advantages(r, estimator="maxrl", offsets=offsets, backend="torch", scale=scale)
        assert torch.allclose(ours.cpu(), ref, rtol=1e-12, atol=1e-13), (backend, scale)


def test_reference_backend():
    _check_backend("torch")
    _check_maxrl("torch")


needs_native = pytest.mark.skipif(not _native.available(), reason="native extension not built")


@needs_native
def test_cpu_kernel_mixtures():
    _check_backend("cpu")


@needs_native
def test_cpu_kernel_maxrl():
    _check_maxrl("cpu")


@needs_native
def test_auto_uses_the_cpu_kernel_for_mixtures():
    from bonkernels import backends, estimators
    for name in estimators.REGISTRY:
        est = estimators.get(name)
        if est.linear_in_tables and "cpu" in est.backends:
            assert backends.select("auto", torch.zeros(4), est, 4).name == "cpu", name


_INTERPRETER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_mixture_backends as t
    getattr(t, {name!r})("triton")
""")


def _run_under_interpreter(name):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT.format(tests=tests, name=name)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_triton_interpreter_mixtures():
    _run_under_interpreter("_check_backend")


def test_triton_interpreter_maxrl():
    _run_under_interpreter("_check_maxrl")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto", "torch"])
def test_gpu_backends(backend):
    if backend == "cuda" and not _native.cuda_available():
        pytest.skip("native CUDA kernels not built")
    _check_backend(backend, "cuda")
    _check_maxrl(backend, "cuda")
