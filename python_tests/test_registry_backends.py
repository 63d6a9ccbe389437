"""Walk the registry: every backend an entry names (field ``backends``) gives the reference's values
for that estimator, and every backend it does not name refuses it.

The reference (``bonkernels/reference.py``, backend "torch") is the specification in code. Each
other backend is called through its backend interface (packed values + offsets) on one SMALL
ragged batch per estimator (groups of 1 to 8 samples, ties, binary rewards for the binary
estimators, deltas for the off-policy ones), for several k, both scales, the too-small rules and,
for the estimators that are linear in their tables, a mixture over k read from a bank:

* "cpu": the C++ extension (skipped when it is not built);
* "triton": under ``TRITON_INTERPRET=1`` in a subprocess (this file run as a script), or on the
  GPU when one is present;
* "cuda": only when the extension was compiled with CUDA and a GPU is present.

Adding an estimator to the registry with a backend that does not implement it, or implementing it
in a backend without naming the backend, fails here (docs/adding-an-estimator.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # when run as a script (the Triton subprocess)
    sys.path.insert(0, str(REPO))

from bonkernels import _native, estimators, reference, tables  # noqa: E402

SIZES = (1, 2, 3, 4, 6, 8)
K_VALUES = (1, 2, 3, 7)          # 7: too large for most groups (the small-groups rules)
K_WEIGHTS = (0.5, 0.0, 1.0, 0.25)
RTOL = 1e-10                     # float64, relative to the largest reference value of the batch
EPS = 1e-6


def batch(est: estimators.Estimator, device: str, seed: int = 0):
    """(values, offsets, deltas) of a small ragged float64 batch suited to the estimator."""
    g = torch.Generator().manual_seed(seed + est.code)
    parts = []
    for i, n in enumerate(SIZES):
        if est.binary:
            v = (torch.rand(n, generator=g) < 0.5).double()
            if i == 3:
                v[:] = 0.0                      # an all-fail group
        elif i % 2:
            v = torch.randint(0, 3, (n,), generator=g).double() / 2.0  # heavy ties
        else:
            v = torch.randn(n, generator=g, dtype=torch.float64)
        parts.append(v)
    values = torch.cat(parts)
    if est.non_negative:
        values = values.abs()                   # e.g. maxrl takes rewards >= 0
    offsets = torch.tensor([0, *torch.tensor(SIZES).cumsum(0).tolist()], dtype=torch.int64)
    deltas = None
    if est.needs_deltas:
        deltas = (0.3 * torch.randn(values.numel(), generator=g, dtype=torch.float64)).clamp(min=-0.9)
    move = (lambda t: None if t is None else t.to(device))
    return move(values), move(offsets), move(deltas)


def calls(est: estimators.Estimator):
    """The argument sets an estimator is checked with (keyword dicts of the backend interface)."""
    ks = K_VALUES if est.uses_k else (1,)
    modes = (1, 2) if est.uses_k else (1,)      # zero, clamp (error is checked before a backend)
    for k in ks:
        for small_groups in modes:
            for mean_scale in (False, True):
                yield dict(k=k, small_groups=small_groups, mean_scale=mean_scale,
                           clamp_delta=0.2 if est.needs_deltas and k == 2 else None)
    if est.linear_in_tables and est.name in tables.BANK_ESTIMATORS:
        for small_groups in (1, 2):
            yield dict(k=1, small_groups=small_groups, mean_scale=False, clamp_delta=None,
                       k_weights=K_WEIGHTS)


def backend_function(backend: str):
    """The backend interface ``advantages_packed`` of a backend, and the device it runs on."""
    if backend == "torch":
        return reference.advantages_packed, "cpu"
    if backend in ("cpu", "cuda"):
        return _native.advantages_packed, backend
    if backend == "triton":
        from bonkernels.triton import advantages as triton_advantages
        device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
        return triton_advantages.advantages_packed, device
    raise ValueError(backend)


def run(fn, est, device, call):
    values, offsets, deltas = batch(est, device)
    bank = bank_index = None
    if "k_weights" in call:
        bank, bank_index = tables.build_bank(est.name, tables.normalize_k_weights(call["k_weights"]),
                                             SIZES, call["small_groups"], torch.device(device))
    return fn(values, offsets, deltas, call["k"], est.code, call["clamp_delta"], -math.inf,
              math.inf, call["mean_scale"], call["small_groups"], EPS, bank=bank,
              bank_index=bank_index)


def mismatches(backend: str) -> list:
    """Every disagreement of ``backend`` with the registry and the reference, as messages."""
    fn, device = backend_function(backend)
    problems = []
    for est in estimators.REGISTRY.values():
        if backend not in est.backends:
            try:
                run(fn, est, device, next(iter(calls(est))))
            except (ValueError, RuntimeError):
                continue
            problems.append(f"{backend} accepts {est.name}, which its registry entry does not "
                            f"list for it (backends={est.backends})")
            continue
        for call in calls(est):
            expected = run(reference.advantages_packed, est, "cpu", call)
            try:
                got = run(fn, est, device, call).cpu()
            except Exception as error:  # noqa: BLE001 (reported with the call)
                problems.append(f"{backend} {est.name} {call}: raised {type(error).__name__}: {error}")
                continue
            finite = torch.isfinite(expected)
            scale = float(expected[finite].abs().max()) if finite.any() else 1.0
            same_specials = bool(torch.equal(expected[~finite].nan_to_num(nan=0.0),
                                             got[~finite].nan_to_num(nan=0.0)))
            error = float((got[finite] - expected[finite]).abs().max()) if finite.any() else 0.0
            if not same_specials or not error <= RTOL * max(scale, 1e-300) or not torch.isfinite(got[finite]).all():
                problems.append(f"{backend} {est.name} {call}: max error {error:.3g} (scale "
                                f"{scale:.3g}); expected {expected.tolist()}, got {got.tolist()}")
    return problems


def _claimed(backend: str) -> list:
    return [e.name for e in estimators.REGISTRY.values() if backend in e.backends]


def test_every_estimator_has_the_reference_and_a_spec_section():
    for est in estimators.REGISTRY.values():
        assert "torch" in est.backends, est.name
        assert est.spec and est.spec != "-", est.name


def test_batch_covers_edges():
    """The walk's input has singletons, ties, an all-fail binary group and a too-large k."""
    assert 1 in SIZES and max(K_VALUES) > max(SIZES) // 2
    values, offsets, _ = batch(estimators.get("passk"), "cpu")
    assert values[offsets[3]:offsets[4]].sum() == 0


@pytest.mark.skipif(not _native.available(), reason="native extension not built")
def test_cpu_backend_matches_the_reference_for_every_claimed_estimator():
    assert _claimed("cpu")
    assert mismatches("cpu") == []


@pytest.mark.skipif(not (_native.available() and _native.cuda_available() and torch.cuda.is_available()),
                    reason="needs the CUDA build of the extension and a GPU")
def test_cuda_backend_matches_the_reference_for_every_claimed_estimator():
    assert mismatches("cuda") == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the interpreter run is below)")
def test_triton_backend_on_gpu_matches_the_reference():
    pytest.importorskip("triton")
    assert mismatches("triton") == []


def test_triton_backend_under_the_interpreter_matches_the_reference():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "triton"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["checked"] == _claimed("triton")
    assert report["problems"] == []


def test_a_wrong_claim_is_caught(monkeypatch):
    """The walk can fail: a registry that lists the reference-only estimator for the cpu backend
    (which refuses it) is reported, and so is a backend whose values are off."""
    if not _native.available():
        pytest.skip("native extension not built")
    exact = estimators.get("maxk_offpolicy_exact")
    fake = estimators.Estimator(**{**exact.__dict__, "backends": ("torch", "cpu", "cuda")})
    monkeypatch.setitem(estimators.REGISTRY, exact.name, fake)
    assert any("maxk_offpolicy_exact" in p and "raised" in p for p in mismatches("cpu"))
    monkeypatch.setitem(estimators.REGISTRY, exact.name, exact)

    def off_by_a_bit(*args, **kwargs):
        return _native.advantages_packed(*args, **kwargs) * (1 + 1e-6)
    monkeypatch.setattr(sys.modules[__name__], "backend_function", lambda b: (off_by_a_bit, "cpu"))
    assert any("max error" in p for p in mismatches("cpu"))


if __name__ == "__main__":
    # The subprocess of test_triton_backend_under_the_interpreter_matches_the_reference.
    which = sys.argv[1]
    print(json.dumps({"checked": _claimed(which), "problems": mismatches(which)}))
