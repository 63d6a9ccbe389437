"""The Triton advantages kernel on inputs that check_inputs=False lets through: NaN/inf rewards and
deltas, malformed or strided offsets, an undersized max_group_size, missing deltas.

Runs under Triton's interpreter (TRITON_INTERPRET=1, see test_triton_interpreter.py) or on a GPU.
The output tensor is placed inside a larger buffer with guard zones and pre-filled with a sentinel,
so a test sees every write outside the output and every output left unwritten.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU (test_triton.py runs it under the interpreter)",
                allow_module_level=True)
pytest.importorskip("triton")
DEVICE = "cpu" if INTERPRETING else "cuda"
pytestmark = pytest.mark.usefixtures("lanes_at_every_batch_size")  # see conftest.py

import bonkernels as bk  # noqa: E402
from bonkernels import reference  # noqa: E402
from bonkernels import triton as bk_triton  # noqa: E402
from bonkernels.triton import _facts  # noqa: E402
from bonkernels.triton import advantages as launcher  # noqa: E402
from bonkernels.triton._advantages_kernel import _cast_like_torch  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@triton.jit
def cast_probe(x_ptr, out_ptr):
    cols = tl.arange(0, 4)
    tl.store(out_ptr + cols, _cast_like_torch(tl.load(x_ptr + cols), tl.bfloat16))

KERNEL_ESTIMATORS = tuple(_facts.kernel_estimators())
GUARD = 64
SENTINEL = 12345.0


class GuardedOutput:
    """Makes the launcher allocate its output inside [guard | output | guard], all SENTINEL."""

    def __init__(self, monkeypatch):
        self.buffers = []
        monkeypatch.setattr(launcher, "_new_output", self._allocate)

    def _allocate(self, values):
        buffer = torch.full((values.numel() + 2 * GUARD,), SENTINEL, dtype=values.dtype,
                            device=values.device)
        self.buffers.append(buffer)
        return buffer[GUARD:GUARD + values.numel()]

    def assert_only_output_written(self):
        for buffer in self.buffers:
            untouched = buffer == torch.full_like(buffer, SENTINEL)  # SENTINEL in buffer's dtype
            assert untouched[:GUARD].all() and untouched[-GUARD:].all(), "written outside"
            left = untouched[GUARD:buffer.numel() - GUARD].nonzero().flatten().tolist()
            assert not left, f"outputs left unwritten at {left}"


def packed_offsets(sizes) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(sizes, dtype=torch.int64).cumsum(0)),
                        dtype=torch.int64, device=DEVICE)


def launch(values, offsets, est, k=2, deltas=None, max_group_size=None, clip=(-math.inf, math.inf),
           mean_scale=True, mode=2, eps=1e-6):
    if est.needs_deltas and deltas is None:
        deltas = torch.zeros_like(values)
    return bk_triton.advantages_packed(values, offsets, deltas, k, est.code, None, clip[0],
                                       clip[1], mean_scale, mode, eps, max_group_size)


def rewards_for(est, sizes, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    if est.binary:
        values = (torch.rand(n, generator=generator) < 0.5).double()
    else:
        values = torch.rand(n, generator=generator, dtype=torch.float64)  # >= 0 (maxrl)
    return values.to(device=DEVICE, dtype=dtype)


# ---------------------------------------------------------------- NaN / inf (checks off)

LAYOUTS = {"lanes-f64": ([5, 8, 3, 7], torch.float64), "lanes-bf16": ([5, 8, 3, 7], torch.bfloat16),
           "spread-f64": ([40, 64, 9, 33], torch.float64),
           "spread-f32": ([40, 64, 9, 33], torch.float32)}
NON_FINITE_CASES = [(e, "lanes-f64") for e in KERNEL_ESTIMATORS] + [
    (_facts.get(name), layout) for name in ("maxk_loo", "maxk_offpolicy", "grpo", "chen_passk")
    for layout in ("lanes-bf16", "spread-f64", "spread-f32")]


@pytest.mark.parametrize("est,layout", NON_FINITE_CASES,
                         ids=[f"{e.name}-{layout}" for e, layout in NON_FINITE_CASES])
def test_non_finite_reward_makes_its_group_nan_and_nothing_else(est, layout, monkeypatch):
    """A NaN, +inf or -inf reward: NaN for every sample of its group, the other groups exactly as
    without it, nothing written outside the output, nothing left unwritten (a NaN used to sort
    after the padding, so a padding index was written past the group)."""
    sizes, dtype = LAYOUTS[layout]
    guarded = GuardedOutput(monkeypatch)
    clean = rewards_for(est, sizes, dtype, seed=est.code)
    offsets = packed_offsets(sizes)
    starts = offsets[:-1].tolist()
    want = launch(clean, offsets, est).double()
    for bad_value in (math.nan, math.inf, -math.inf):
        values = clean.clone()
        values[starts[0]] = bad_value            # first sample of group 0
        values[starts[2] + 2] = bad_value        # a middle sample of group 2
        if bad_value == math.inf:
            values[starts[2] + 1] = -math.inf
        got = launch(values, offsets, est).double()
        bad_groups = (0, 2)
        for g, (start, n) in enumerate(zip(starts, sizes)):
            part = got[start:start + n]
            if g in bad_groups:
                assert part.isnan().all(), (est.name, bad_value, g, part)
            else:
                torch.testing.assert_close(part, want[start:start + n], rtol=0, atol=0,
                                           equal_nan=True)
    guarded.assert_only_output_written()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_non_finite_delta_makes_its_group_nan(dtype, monkeypatch):
    guarded = GuardedOutput(monkeypatch)
    est = _facts.get("maxk_offpolicy")
    sizes = [6, 4, 9]
    offsets = packed_offsets(sizes)
    values = rewards_for(est, sizes, dtype, seed=3)
    deltas = (torch.rand(values.numel(), generator=torch.Generator().manual_seed(4)) - 0.5).to(
        device=DEVICE, dtype=dtype)
    want = launch(values, offsets, est, deltas=deltas).double()
    for bad in (math.nan, math.inf, -math.inf):
        d = deltas.clone()
        d[7] = bad  # group 1
        # a clamp would turn +-inf into the bound: the contract still says NaN
        got = bk_triton.advantages_packed(values, offsets, d, 2, est.code, 0.5, -math.inf,
                                          math.inf, True, 2, 1e-6, None).double()
        assert got[6:10].isnan().all()
        ref = bk_triton.advantages_packed(values, offsets, deltas, 2, est.code, 0.5, -math.inf,
                                          math.inf, True, 2, 1e-6, None).double()
        assert torch.equal(got[:6], ref[:6]) and torch.equal(got[10:], ref[10:])
    assert torch.isfinite(want).all()
    guarded.assert_only_output_written()


# ---------------------------------------------------------------- strided index tensors

def test_strided_offsets_give_the_contiguous_results():
    """offsets = t[::2] used to be read as if contiguous (results off by up to 1.07)."""
    est = _facts.get("maxk_loo1")
    sizes = [5, 3, 8, 1, 6]
    values = rewards_for(est, sizes, torch.float64, seed=5)
    offsets = packed_offsets(sizes)
    interleaved = torch.stack([offsets, torch.full_like(offsets, 10**6)], 1).flatten()
    strided = interleaved[::2]
    assert not strided.is_contiguous() and torch.equal(strided, offsets)
    want = launch(values, offsets, est, k=3)
    torch.testing.assert_close(launch(values, strided, est, k=3), want, rtol=0, atol=0)


def test_strided_layouts_through_the_public_api():
    generator = torch.Generator().manual_seed(6)
    flat = torch.rand(23, generator=generator, dtype=torch.float64).to(DEVICE)
    offsets = torch.tensor([0, 0, 5, 5, 9, 9, 16, 16, 23, 23], device=DEVICE)[::2]
    lengths = torch.tensor([[5, 0], [2, 0], [6, 0]], device=DEVICE)[:, 0]
    padded = torch.rand(3, 6, generator=generator, dtype=torch.float64).to(DEVICE)
    ids = torch.stack([torch.randint(0, 4, (23,), generator=generator),
                       torch.zeros(23, dtype=torch.int64)], 1).to(DEVICE)[:, 0]
    calls = [((flat,), dict(offsets=offsets)), ((padded,), dict(lengths=lengths)),
             ((flat,), dict(group_ids=ids))]
    for (rewards,), layout in calls:
        kwargs = dict(small_groups="clamp", **layout)
        a = bk.advantages(rewards, 2, "maxk_loo1", backend="triton", **kwargs)
        b = bk.advantages(rewards, 2, "maxk_loo1", backend="torch", **kwargs)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- malformed offsets (checks off)

def test_malformed_offsets_stay_inside_the_tensors(monkeypatch):
    """Decreasing, negative and past-the-end offsets: only samples of the output are written, the
    well-formed groups keep their values."""
    guarded = GuardedOutput(monkeypatch)
    est = _facts.get("maxk")
    values = rewards_for(est, [12], torch.float64, seed=7)
    good = launch(values, packed_offsets([4, 8]), est, max_group_size=8)[:4]
    # (offsets, whether group 0 is left alone by the others)
    cases = [([0, 4, 2, 9], False), ([0, 4, -3, 8], False), ([0, 4, 11, 30], True),
             ([0, 4, 4, 12 + GUARD], True), ([0, 4, 9, 6], True), ([0, 4, 10**6, 5], True)]
    for bad, separate in cases:
        out = launch(values, torch.tensor(bad, device=DEVICE), est, max_group_size=8)
        if separate:
            assert torch.equal(out[:4], good), bad
    for buffer in guarded.buffers:
        untouched = buffer == torch.full_like(buffer, SENTINEL)
        assert untouched[:GUARD].all() and untouched[-GUARD:].all(), "written outside"


def test_wild_offsets_do_not_crash_the_process():
    """Offsets far outside the values used to corrupt the heap (SIGABRT/SIGSEGV): a subprocess,
    so a crash fails this test instead of the whole run."""
    script = textwrap.dedent("""
        import math, torch
        from bonkernels import triton as bk_triton
        values = torch.rand(16, dtype=torch.float64, device=DEVICE)
        for bad in ([0, 10**15], [-10**15, 8], [0, 8, 2**40, 2**41], [5, -10**12]):
            offsets = torch.tensor(bad, device=DEVICE)
            out = bk_triton.advantages_packed(values, offsets, None, 2, 0, None, -math.inf,
                                              math.inf, True, 2, 1e-6, 8)
            assert out.shape == values.shape
        print("WILD_OK")
    """).replace("DEVICE", repr(DEVICE))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "WILD_OK" in proc.stdout, (proc.returncode,
                                                                proc.stderr[-3000:])


# ---------------------------------------------------------------- undersized max_group_size

@pytest.mark.parametrize("sizes,hint", [([3, 12, 5, 20], 8), ([70, 9, 200], 64)],
                         ids=["thread-per-group", "group-across-threads"])
def test_groups_above_the_block_are_nan_filled(sizes, hint, monkeypatch):
    guarded = GuardedOutput(monkeypatch)
    est = _facts.get("maxk_loo1")
    values = rewards_for(est, sizes, torch.float32, seed=8)
    offsets = packed_offsets(sizes)
    got = launch(values, offsets, est, max_group_size=hint).double()
    want = launch(values, offsets, est).double()
    block = bk_triton._config.block_for(hint)
    for start, n in zip(offsets[:-1].tolist(), sizes):
        part = got[start:start + n]
        if n > block:
            assert part.isnan().all(), (n, part)
        else:
            torch.testing.assert_close(part, want[start:start + n], rtol=0, atol=0)
    guarded.assert_only_output_written()


# ---------------------------------------------------------------- deltas, clip

def test_offpolicy_without_deltas_is_refused():
    """deltas=None used to read the rewards as deltas."""
    est = _facts.get("maxk_offpolicy")
    values = rewards_for(est, [6], torch.float64, seed=9)
    with pytest.raises(ValueError, match="needs deltas"):
        bk_triton.advantages_packed(values, packed_offsets([6]), None, 2, est.code, None,
                                    -math.inf, math.inf, True, 2, 1e-6, 6)


def test_deltas_are_never_read_by_on_policy_estimators():
    est = _facts.get("maxk")
    values = rewards_for(est, [6, 5], torch.float64, seed=10)
    offsets = packed_offsets([6, 5])
    junk = torch.full_like(values, math.nan)
    with_junk = bk_triton.advantages_packed(values, offsets, junk, 2, est.code, None, -math.inf,
                                            math.inf, True, 2, 1e-6, 6)
    assert torch.equal(with_junk, launch(values, offsets, est))


def test_clip_keeps_nan_and_clips_the_rest():
    """With a finite clip, a group that yields NaN stays NaN (never the bound)."""
    est = _facts.get("dr_grpo")
    values = torch.tensor([0.1, 0.9, math.nan, 0.4, 0.0, 1.0], dtype=torch.float64, device=DEVICE)
    out = launch(values, packed_offsets([3, 3]), est, clip=(-0.2, 0.2))
    assert out[:3].isnan().all()
    ref = reference.advantages_packed(values[3:], packed_offsets([3]), None, 2, est.code, None,
                                      -0.2, 0.2, True, 2, 1e-6)
    torch.testing.assert_close(out[3:], ref, rtol=0, atol=1e-15)


def test_launch_runs_under_the_values_device_guard(monkeypatch):
    """Every eager launch enters _config.device_guard(values) (on a GPU: torch.cuda.device of the
    values, which also selects that device's current stream for Triton's launcher)."""
    import contextlib

    seen = []

    @contextlib.contextmanager
    def recording_guard(tensor):
        seen.append(tensor.device)
        yield

    monkeypatch.setattr(bk_triton._config, "device_guard", recording_guard)
    est = _facts.get("grpo")
    values = rewards_for(est, [4, 4], torch.float32, seed=11)
    launch(values, packed_offsets([4, 4]), est)
    assert seen == [values.device]


def test_policy_loss_launch_runs_under_the_device_guard(monkeypatch):
    import contextlib

    from bonkernels.loss import policy_loss
    from bonkernels.triton import policy_loss as triton_loss

    seen = []

    @contextlib.contextmanager
    def recording_guard(tensor):
        seen.append(tensor.device)
        yield

    monkeypatch.setattr(triton_loss, "device_guard", recording_guard)
    logp = torch.randn(4, 5, dtype=torch.float64, device=DEVICE).requires_grad_()
    loss, _ = policy_loss(logp, logp.detach() + 0.1, torch.rand(4, dtype=torch.float64,
                                                                 device=DEVICE),
                          2, group_size=4, backend="triton")
    loss.backward()
    assert seen == [logp.device]


def test_bfloat16_cast_keeps_every_nan():
    """The GPU's NaN is all ones (0x7FFFFFFF as float32): rounding its bits to bfloat16 used to wrap
    into -0.0. Any NaN payload must stay NaN."""
    bits = torch.tensor([0x7FFFFFFFFFFFFFFF, 0x7FF8000000000000, -1, 0x3FF0000000000000],
                        dtype=torch.int64)
    x = bits.view(torch.float64).to(DEVICE)
    out = torch.empty(4, dtype=torch.bfloat16, device=DEVICE)
    cast_probe[(1,)](x, out)
    assert out[:3].isnan().all() and out[3].item() == 1.0, out


def test_public_api_with_checks_off_gives_nan_groups():
    rewards = torch.rand(3, 6, dtype=torch.float32, device=DEVICE)
    rewards[1, 2] = math.nan
    rewards[2, 0] = math.inf
    out = bk.advantages(rewards, 2, "maxk_loo1", backend="triton", check_inputs=False)
    assert out[1:].isnan().all() and torch.isfinite(out[0]).all()
    want = bk.advantages(rewards[:1], 2, "maxk_loo1", backend="torch")
    torch.testing.assert_close(out[:1], want, rtol=1e-6, atol=1e-6)
