"""The contract of bk.advantages that every backend shares (the validation layer and the backend
table): constant groups, extreme float64 values, detached rewards, argument types, k of any size,
unsupported devices, and a sync-free call with check_inputs=False and a size hint.

Each ``check_*`` function takes a backend name; the torch and cpu backends run here, Triton runs
the same functions under its interpreter in a subprocess (tiny inputs: the interpreter is slow),
and every one of them runs on a GPU when there is one.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import bonkernels as bk
from bonkernels import _native, backends, estimators
from sync_ops import Recorder, syncs

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CENTRED = ("grpo", "rloo", "dr_grpo", "bon_mean", "chen_passk")
IGNORE_K = tuple(name for name, e in estimators.REGISTRY.items() if not e.uses_k)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# ----------------------------------------------------------------------------- checks per backend

def check_constant_groups_are_zero(backend, device="cpu"):
    for dtype in DTYPES:
        for est in CENTRED:
            value = 1.0 if est == "chen_passk" else 0.5402
            r = torch.full((2, 16), value, dtype=dtype, device=device)
            for eps in (0.0, 1e-6, 0.1):
                for scale in ("sum", "mean"):
                    a = bk.advantages(r, 2, est, eps=eps, scale=scale, backend=backend)
                    assert torch.equal(a, torch.zeros_like(a)), (backend, dtype, est, eps, scale, a)


def check_grpo_extreme_float64(backend, device="cpu"):
    x = torch.tensor([[1.7e308, -1.7e308, 0.0, 1.0]], dtype=torch.float64, device=device)
    a = bk.advantages(x, None, "grpo", backend=backend).cpu()
    # mean 0.25, sample std sqrt(2/3) * 1.7e308 (the eps of 1e-6 is below its rounding)
    std = math.sqrt(2.0 / 3.0) * 1.7e308
    true = torch.tensor([[(1.7e308 - 0.25) / std, (-1.7e308 - 0.25) / std, -0.25 / std, 0.75 / std]],
                        dtype=torch.float64)
    assert torch.isfinite(a).all(), (backend, a)
    assert torch.allclose(a, true, rtol=1e-12, atol=1e-300), (backend, a, true)


def check_rewards_requiring_grad(backend, device="cpu"):
    r = torch.rand(3, 8, dtype=torch.float64, device=device, requires_grad=True)
    d = (0.1 * torch.rand(3, 8, dtype=torch.float64, device=device)).requires_grad_()
    for est, kw in (("maxk_loo1", {}), ("grpo", {}), ("maxk_offpolicy", {"deltas": d})):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)     # no backend may warn about it
            a = bk.advantages(r, 2, est, backend=backend, **kw)
        assert not a.requires_grad and a.grad_fn is None, (backend, est)
        plain = bk.advantages(r.detach(), 2, est, backend=backend,
                              **{key: v.detach() for key, v in kw.items()})
        assert torch.equal(a, plain), (backend, est)
        ref = bk.advantages(r.detach().cpu(), 2, est, backend="torch",
                            **{key: v.detach().cpu() for key, v in kw.items()})
        assert torch.allclose(a.cpu(), ref, rtol=1e-12, atol=1e-13), (backend, est)


def check_argument_types(backend, device="cpu"):
    r = torch.rand(2, 4, device=device)
    d = torch.zeros(2, 4, device=device)
    for clip in ("12", b"12", (1, "2"), ("1", "2"), (1,), (1, 2, 3), 12, (True, 2), (1, None)):
        with pytest.raises(ValueError, match="clip must be a"):
            bk.advantages(r, 2, "maxk", clip=clip, backend=backend)
    for c in (True, "1", 0, -1.0, float("nan"), (1.0,)):
        with pytest.raises(ValueError, match="clamp_delta"):
            bk.advantages(r, 2, "maxk_offpolicy", deltas=d, clamp_delta=c, backend=backend)
    for k in (True, False, 2.0, "2", torch.tensor(2)):
        with pytest.raises(TypeError, match="k must be a Python int"):
            bk.advantages(r, k, "maxk", backend=backend)
    # the accepted spellings still work
    bk.advantages(r, 2, "maxk", clip=(-1, 1.5), backend=backend)
    bk.advantages(r, 2, "maxk_offpolicy", deltas=d, clamp_delta=1, backend=backend)


def check_k_of_any_size(backend, device="cpu"):
    g = torch.Generator().manual_seed(0)
    r = torch.rand(3, 6, generator=g, dtype=torch.float64).to(device)
    for k in (2 ** 31, 2 ** 40, 10 ** 30):
        clamped = bk.advantages(r, k, "maxk", small_groups="clamp", backend=backend)
        assert torch.equal(clamped, bk.advantages(r, 6, "maxk", backend=backend)), (backend, k)
        zero = bk.advantages(r, k, "maxk_loo1", small_groups="zero", backend=backend)
        assert torch.equal(zero, torch.zeros_like(zero)), (backend, k)
        for est in IGNORE_K:
            assert torch.equal(bk.advantages(r, k, est, backend=backend),
                               bk.advantages(r, 1, est, backend=backend)), (backend, est, k)
        with pytest.raises(ValueError, match=f"k = {k}"):
            bk.advantages(r, k, "maxk", backend=backend)


ALL_CHECKS = ("check_constant_groups_are_zero", "check_grpo_extreme_float64",
              "check_rewards_requiring_grad", "check_argument_types", "check_k_of_any_size")

needs_native = pytest.mark.skipif(not _native.available(), reason="native extension not built")
BACKEND_PARAMS = [pytest.param("torch"), pytest.param("cpu", marks=needs_native)]


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
@pytest.mark.parametrize("check", ALL_CHECKS)
def test_contract(check, backend):
    globals()[check](backend)


_INTERPRETER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_api_contract as t
    for name in t.ALL_CHECKS:
        getattr(t, name)("triton")
    t.check_sync_free("triton")
    print("ok")
""")


def test_contract_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", _INTERPRETER_SCRIPT.format(tests=tests)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
@pytest.mark.parametrize("check", ALL_CHECKS)
def test_contract_gpu(check, backend):
    if backend == "cuda" and not _native.cuda_available():
        pytest.skip("native CUDA kernels not built")
    globals()[check](backend, "cuda")


# ----------------------------------------------------------------------------- devices

def test_unsupported_devices_are_named():
    r = torch.rand(2, 4, device="meta")
    calls = (lambda: bk.advantages(r, 2), lambda: bk.pass_at_k(r, 2), lambda: bk.max_at_k(r, 2),
             lambda: bk.maxk_objective(r, torch.zeros(2, 4, device="meta"), 2))
    for call in calls:
        with pytest.raises(ValueError, match="'meta' device"):
            call()
    with pytest.raises(ValueError, match="deltas is on meta"):
        bk.advantages(torch.rand(2, 4), 2, "maxk_offpolicy", deltas=torch.zeros(2, 4, device="meta"))


# ----------------------------------------------------------------------------- host syncs

def _sync_free_calls(device="cpu"):
    r = torch.rand(4, 8, dtype=torch.float32, device=device)
    lengths = torch.tensor([8, 3, 0, 5], device=device)
    offsets = torch.tensor([0, 8, 11, 11, 16], device=device)
    flat = r.reshape(-1)[:16].contiguous()
    layouts = {"full": (r, {}), "padded": (r, {"lengths": lengths}), "packed": (flat, {"offsets": offsets})}
    for layout, (x, kw) in layouts.items():
        for how in ({"k": 2}, {"k_weights": (0.5, 0.0, 0.5)}):
            for est in ("maxk_loo1", "grpo") if "k" in how else ("maxk_loo1",):
                yield f"{layout}/{est}/{next(iter(how))}", x, dict(kw, estimator=est, **(how if est != "grpo" else {}))


def check_sync_free(backend, device="cpu", report=None):
    """check_inputs=False with max_group_size: no op that syncs with the host, and few ops."""
    for label, x, kw in _sync_free_calls(device):
        def call():
            return bk.advantages(x, backend=backend, check_inputs=False, max_group_size=8,
                                 small_groups="clamp", **kw)
        expected = call()                       # warm: the backend probe, the bank cache
        rec = Recorder()
        with rec:
            got = call()
        assert not syncs(rec.ops), (backend, label, syncs(rec.ops))
        assert torch.equal(got, expected)
        checked = bk.advantages(x, backend=backend, small_groups="clamp", **kw)
        assert torch.equal(got, checked), (backend, label)
        if report is not None:
            report[label] = len(rec.ops)


@needs_native
def test_sync_free_cpu_backend():
    counts = {}
    check_sync_free("cpu", report=counts)
    # the layout work around one fused op: full 6, padded 19, packed 2 (aten + the custom op)
    assert max(counts.values()) <= 24, counts


@needs_native
def test_sync_free_auto_picks_the_kernel():
    counts = {}
    check_sync_free("auto", report=counts)
    assert max(counts.values()) <= 24, counts


def test_group_ids_sync_is_documented():
    # The group_ids layout needs the number of distinct ids (a data-dependent size): it syncs once.
    r = torch.rand(8)
    rec = Recorder()
    with rec:
        bk.advantages(r, 2, group_ids=torch.tensor([0, 1, 0, 1, 2, 2, 2, 2]), check_inputs=False,
                      max_group_size=4, backend="torch")
    assert "aten::unique_consecutive" in syncs(rec.ops)
    assert "group_ids" in bk.advantages.__doc__ and "syncs" in bk.advantages.__doc__


def test_padded_without_checks_matches_checked():
    g = torch.Generator().manual_seed(1)
    r = torch.rand(5, 7, generator=g, dtype=torch.float64)
    r[1, 3:] = float("nan")                     # padding may hold anything
    lengths = torch.tensor([7, 3, 0, 1, 5])
    for est in ("maxk_loo1", "grpo", "maxk", "tang_loo"):
        for backend in ("torch",) + (("cpu",) if _native.available() else ()):
            fast = bk.advantages(r, 1, est, lengths=lengths, check_inputs=False, backend=backend,
                                 small_groups="zero")
            checked = bk.advantages(r, 1, est, lengths=lengths, backend=backend, small_groups="zero")
            assert torch.equal(fast, checked), (est, backend)
            assert (fast[1, 3:] == 0).all() and (fast[2] == 0).all()


def test_backend_table_rows_follow_the_registry():
    from bonkernels import estimators
    for est in estimators.REGISTRY.values():
        for name in backends.NAMES:
            assert backends.ROWS[name].serves(est) == (name in est.backends)
    assert backends.select("auto", torch.rand(4), estimators.get("maxk_offpolicy_exact"), 4).name == "torch"
    if _native.available():
        assert backends.select("auto", torch.rand(4), estimators.get("maxk"), None).name == "cpu"
    assert backends.kernel_k(10 ** 30) == 2 ** 31 - 1 and backends.kernel_k(5) == 5


@needs_native
def test_native_op_caps_a_large_k_itself():
    # the kernels' own guard: a k beyond int32 acts like any k above every group size
    values = torch.rand(8, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 8])
    big = _native.advantages_packed(values, offsets, None, 2 ** 40, 0, None, -math.inf, math.inf, False, 2, 1e-6)
    ref = bk.advantages(values, 8, "maxk", offsets=offsets, small_groups="clamp", backend="torch", scale="sum")
    assert torch.allclose(big, ref, rtol=1e-12, atol=1e-14)


def test_trainer_integrations_share_the_checks():
    from bonkernels import validation
    check = validation.check_trainer_estimator
    assert check("maxk_loo1", "X", k=4).name == "maxk_loo1"
    assert check("grpo", "X").name == "grpo"                       # ignores k
    with pytest.raises(ValueError, match="current policy"):
        check("maxk_offpolicy", "X", k=4)
    with pytest.raises(ValueError, match="needs k"):
        check("maxk", "X")
    with pytest.raises(ValueError, match="either k or k_weights"):
        check("maxk", "X", k=2, k_weights=(1.0,))
    with pytest.raises(TypeError, match="k must be a Python int"):
        check("maxk", "X", k=True)
    with pytest.raises(ValueError, match="scale"):
        check("maxk", "X", k=2, scale="avg")
    with pytest.raises(ValueError, match="eps"):
        check("maxk", "X", k=2, eps=-1.0)


@needs_native
def test_torch_compile_fullgraph_padded_and_mixture():
    """The sync-free call traces without a graph break for the padded layout and a mixture too."""
    r = torch.rand(3, 8, dtype=torch.float32)
    lengths = torch.tensor([8, 2, 5])

    def step(r, lengths):
        a = bk.advantages(r, 2, "maxk_loo1", lengths=lengths, check_inputs=False, backend="cpu",
                          small_groups="clamp")
        m = bk.advantages(r, estimator="maxk", k_weights=(0.5, 0.5), lengths=lengths, check_inputs=False,
                          backend="cpu", small_groups="clamp")
        return a, m

    bk.advantages(r, estimator="maxk", k_weights=(0.5, 0.5), lengths=lengths, check_inputs=False,
                  backend="cpu", small_groups="clamp")           # the bank, built and cached eagerly
    a, m = torch.compile(step, fullgraph=True, backend="aot_eager")(r, lengths)
    want_a, want_m = step(r, lengths)
    assert torch.equal(a, want_a) and torch.equal(m, want_m)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_sync_free_on_gpu(backend):
    """On a GPU, CUDA's own sync detector agrees: no synchronising call with check_inputs=False."""
    if backend == "cuda" and not _native.cuda_available():
        pytest.skip("native CUDA kernels not built")
    check_sync_free(backend, "cuda")            # warms up, then records the ops
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _, x, kw in _sync_free_calls("cuda"):
            bk.advantages(x, backend=backend, check_inputs=False, max_group_size=8, small_groups="clamp", **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
