"""The Triton kernels against the PyTorch reference: on CPU tensors under Triton's interpreter,
or on CUDA tensors when a GPU is present.

The interpreter needs TRITON_INTERPRET=1 in the environment before triton is imported, so on a
machine without a GPU these tests run in their own process:

    TRITON_INTERPRET=1 .venv/bin/python -m pytest python_tests/test_triton_interpreter.py -q

(python_tests/test_triton.py does exactly that from the ordinary suite.) Without the variable and
without CUDA the module is skipped.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip("needs TRITON_INTERPRET=1 or a GPU (test_triton.py runs it under the interpreter)",
                allow_module_level=True)
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
DEVICE = "cpu" if INTERPRETING else "cuda"
pytestmark = pytest.mark.usefixtures("lanes_at_every_batch_size")  # see conftest.py

import bonkernels as bk  # noqa: E402
from bonkernels import estimators, reference, tables  # noqa: E402
from bonkernels import triton as bk_triton  # noqa: E402
from bonkernels.triton import _advantages_kernel as _kernel  # noqa: E402
from bonkernels.triton import _config, _facts  # noqa: E402

SUPPORTED = tuple(e for e in estimators._ENTRIES if _facts.in_kernel(e))
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Relative tolerance (to the group's scale) per output dtype: the kernel and the reference both
# compute in float64 and cast once, so only a float64 rounding difference that straddles a
# rounding boundary of the output dtype can show (one unit in the last place).
RTOL = {torch.float64: 1e-10, torch.float32: 2.0 ** -22, torch.float16: 2.0 ** -9,
        torch.bfloat16: 2.0 ** -6}
MODES = {"error": 0, "zero": 1, "clamp": 2}


def packed_offsets(sizes) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(sizes, dtype=torch.int64).cumsum(0)),
                        dtype=torch.int64, device=DEVICE)


def make_rewards(sizes, est, dtype, generator, tied_fraction=0.5) -> torch.Tensor:
    """Rewards per group: binary for binary estimators; else Gaussian, with heavy ties in some groups."""
    parts = []
    for n in sizes:
        if est.binary:
            g = (torch.rand(n, generator=generator) < 0.6).double()
        elif torch.rand(1, generator=generator).item() < tied_fraction:
            g = torch.randint(0, 3, (n,), generator=generator).double() / 2.0  # {0, .5, 1}
        else:
            g = torch.randn(n, generator=generator, dtype=torch.float64)
        parts.append(g)
    values = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    return values.to(device=DEVICE, dtype=dtype)


def make_deltas(values, est, generator):
    if not est.needs_deltas:
        return None
    deltas = (torch.rand(values.numel(), generator=generator, dtype=torch.float64) - 0.5) * 0.6
    return deltas.to(device=values.device, dtype=values.dtype)


def default_clip(est):
    return estimators.BON_RLB_DEFAULT_CLIP if est.name == "bon_rlb" else (-math.inf, math.inf)


def assert_matches_reference(values, offsets, deltas, k, est, *, clamp_delta=None, clip=None,
                             mean_scale=True, mode="clamp", eps=1e-6, max_group_size=None):
    clip_lo, clip_hi = clip if clip is not None else default_clip(est)
    args = (values, offsets, deltas, k, est.code, clamp_delta, clip_lo, clip_hi, mean_scale,
            MODES[mode], eps)
    out = bk_triton.advantages_packed(*args, max_group_size)
    ref = reference.advantages_packed(*args, None)
    assert out.dtype == values.dtype and out.shape == values.shape
    a, b = out.double(), ref.double()
    assert torch.isfinite(a).all() == torch.isfinite(b).all()
    sizes = (offsets[1:] - offsets[:-1]).tolist()
    start = 0
    for g, n in enumerate(sizes):
        if n == 0:
            continue
        ag, bg = a[start:start + n], b[start:start + n]
        xg = values[start:start + n].double()
        scale = max(bg.abs().max().item(), xg.abs().max().item(), 1e-300)
        tol = RTOL[values.dtype] * scale
        err = (ag - bg).abs().max().item()
        assert err <= tol, (f"{est.name} {values.dtype} k={k} mode={mode} mean_scale={mean_scale}: "
                            f"group {g} (n={n}) differs by {err:.3g} > {tol:.3g}\n"
                            f"rewards {xg.tolist()}\ntriton {ag.tolist()}\nreference {bg.tolist()}")
        start += n


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("est", SUPPORTED, ids=lambda e: e.name)
def test_ragged_small_groups_match_reference(est, dtype):
    """Ragged batch with an empty group, singletons, ties, sizes that are not powers of two
    (BLOCK=16, a thread per group), too-small groups zeroed or clamped, both scales."""
    generator = torch.Generator().manual_seed(1000 + est.code)
    sizes = [5, 1, 8, 3, 0, 7, 2, 16, 13, 4, 1, 11]
    offsets = packed_offsets(sizes)
    for k in (2, 5):
        for mode in ("zero", "clamp"):
            for mean_scale in (False, True):
                values = make_rewards(sizes, est, dtype, generator)
                deltas = make_deltas(values, est, generator)
                before = values.clone()
                assert_matches_reference(values, offsets, deltas, k, est, mode=mode,
                                         mean_scale=mean_scale,
                                         clamp_delta=0.2 if deltas is not None and k == 2 else None)
                assert torch.equal(values, before)


@pytest.mark.parametrize("est", SUPPORTED, ids=lambda e: e.name)
def test_spread_layout_of_small_batches_at_small_blocks(est):
    """Below LANE_MIN_GROUPS groups, blocks 8 and 16 spread each group over threads (the lanes pay
    only on a full GPU): the same values as the reference, ragged, ties, both scales."""
    generator = torch.Generator().manual_seed(1500 + est.code)
    with _config.lane_threshold(2**62):  # every batch takes the spread layout
        for sizes in ([5, 1, 8, 3, 0, 7, 2, 16, 13, 4, 1, 11], [3, 8, 1, 6, 2]):
            block = _config.block_for(max(sizes))
            assert not _config.config_for(block, True, len(sizes)).lanes
            offsets = packed_offsets(sizes)
            for dtype, mean_scale in ((torch.float32, True), (torch.float64, False)):
                values = make_rewards(sizes, est, dtype, generator)
                deltas = make_deltas(values, est, generator)
                assert_matches_reference(values, offsets, deltas, 2, est, mode="clamp",
                                         mean_scale=mean_scale,
                                         clamp_delta=0.2 if deltas is not None else None)


@pytest.mark.parametrize("est", SUPPORTED, ids=lambda e: e.name)
def test_valid_groups_k1_and_k_equal_n(est):
    """small_groups='error' (every group valid), the k = 1 and k = n edge cases, float64."""
    generator = torch.Generator().manual_seed(2000 + est.code)
    sizes = [4, 6, 3, 8, 5, 2]
    offsets = packed_offsets(sizes)
    k_top = min(sizes) - est.k_margin
    for k in sorted({1, min(2, k_top), k_top}):  # k_top = n for the smallest group
        values = make_rewards(sizes, est, torch.float64, generator)
        deltas = make_deltas(values, est, generator)
        assert_matches_reference(values, offsets, deltas, k, est, mode="error")


@pytest.mark.parametrize("sizes", [[3, 8, 1, 6] * 18, [30, 17, 32, 1, 0, 9]],
                         ids=["block8-two-programs", "block32"])
@pytest.mark.parametrize("name", ["maxk_loo1", "maxk_offpolicy", "bon_mean", "chen_passk"])
def test_other_small_blocks(name, sizes):
    """BLOCK=8 (a thread per group) with more groups than one program holds, and BLOCK=32 (a
    group across threads)."""
    est = estimators.get(name)
    generator = torch.Generator().manual_seed(3000 + est.code)
    values = make_rewards(sizes, est, torch.float64, generator)
    deltas = make_deltas(values, est, generator)
    assert_matches_reference(values, packed_offsets(sizes), deltas, 3, est, mode="zero")


@pytest.mark.parametrize("est", [e for e in SUPPORTED if not e.needs_deltas], ids=lambda e: e.name)
def test_own_kernel_lanes_at_block_32(est):
    """On a GPU, an on-policy launch that runs its estimator's own kernel takes a thread per group
    up to BLOCK = 32 for 16- and 32-bit rewards (_config.OWN_KERNEL_LANE_MAX_BLOCK); the same
    source with the layout forced: ragged groups with ties, a singleton and an empty group, k
    zeroed or clamped, both scales, and one k's tables from a bank through bk.advantages."""
    generator = torch.Generator().manual_seed(3500 + est.code)
    sizes = [30, 17, 32, 1, 0, 9, 25, 32]
    offsets = packed_offsets(sizes)
    with _config.own_kernel_lanes(True):
        own = _config.takes_own_kernel_lanes(False, torch.float32)
        assert _config.config_for(32, est.needs_deltas, len(sizes), own).lanes
        for dtype, k, mode, mean_scale in ((torch.float32, 2, "zero", True),
                                           (torch.bfloat16, 5, "clamp", False)):
            values = make_rewards(sizes, est, dtype, generator)
            assert_matches_reference(values, offsets, None, k, est, mode=mode, mean_scale=mean_scale)
        if est.name in tables.BANK_ESTIMATORS:
            rewards = make_rewards([32] * 3, est, torch.float32, generator).view(3, 32)
            a = bk.advantages(rewards, 4, est.name, backend="triton", small_groups="clamp")
            b = bk.advantages(rewards, 4, est.name, backend="torch", small_groups="clamp")
            torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("est", [e for e in SUPPORTED if e.centred], ids=lambda e: e.name)
def test_centred_own_kernel_lanes_at_block_64(est):
    """A centred estimator's own kernel (the registry's `centred`) keeps a thread per group up to
    BLOCK = 64 (_config.CENTRED_LANE_MAX_BLOCK; the other estimators stop at 32): the same source
    with the layout forced, ragged groups with ties, a singleton, an empty group, both scales."""
    generator = torch.Generator().manual_seed(3700 + est.code)
    sizes = [64, 33, 1, 0, 57, 64, 40]
    offsets = packed_offsets(sizes)
    with _config.own_kernel_lanes(True):
        own = _config.takes_own_kernel_lanes(False, torch.float32)
        assert _config.config_for(64, False, len(sizes), own, est.centred).lanes
        assert not _config.config_for(64, False, len(sizes), own, False).lanes
        for dtype, mean_scale in ((torch.float32, True), (torch.bfloat16, False)):
            values = make_rewards(sizes, est, dtype, generator)
            assert_matches_reference(values, offsets, None, 3, est, mode="zero", mean_scale=mean_scale)


@pytest.mark.parametrize("name", [e.name for e in SUPPORTED if e.one_pass])
def test_serial_lanes_from_a_bank(name):
    """From a bank, where a thread holds its group, these estimators go through it a column at a
    time (the kernel's _serial_outputs: on a GPU in their own kernels, up to the estimator's
    _config.serial_lanes_up_to; under the interpreter in every lane launch). At 16 and at the
    estimator's top block: ragged groups with ties, a singleton and an empty group, one k's bank
    and a mixture's, both scales, a clip, clamped deltas: the reference's values, and the bits of
    the tile code (interpreter_serial(False), the kernel with every estimator's path on a GPU)."""
    est = estimators.get(name)
    top = _config.serial_lanes_up_to(est, True)
    generator = torch.Generator().manual_seed(3800 + est.code)
    for block in sorted({16, top}):
        sizes = [block, block // 2 + 1, 1, 0, block - 3, block]
        offsets = packed_offsets(sizes)
        with _config.own_kernel_lanes(True):
            own = _config.takes_own_kernel_lanes(False, torch.float32)
            serial_block = _config.serial_lanes_up_to(est, True)
            assert _config.config_for(block, est.needs_deltas, len(sizes), own, est.centred, serial_block).lanes
            for dtype, weights, mean_scale, clip in ((torch.float32, (0.0, 0.0, 1.0), True, None),
                                                     (torch.bfloat16, (0.5, 0.0, 0.3, 0.2), False, (-0.5, 0.8))):
                values = make_rewards(sizes, est, dtype, generator)
                deltas = make_deltas(values, est, generator)
                bank, bank_index = tables.build_bank(name, weights, tuple(range(1, block + 1)), MODES["clamp"],
                                                     values.device)
                lo, hi = clip if clip is not None else (-math.inf, math.inf)
                args = (values, offsets, deltas, 1, est.code, 0.2 if deltas is not None else None, lo, hi,
                        mean_scale, MODES["clamp"], 1e-6, block)
                got = bk_triton.advantages_packed(*args, bank=bank, bank_index=bank_index)
                with _config.interpreter_serial(False):
                    tiles = bk_triton.advantages_packed(*args, bank=bank, bank_index=bank_index)
                assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                                   tiles.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), (name, block)
                want = reference.advantages_packed(values.double(), offsets, None if deltas is None
                                                   else deltas.double(), *args[3:12], bank=bank,
                                                   bank_index=bank_index)
                scale = max(want.abs().max().item(), 1.0)
                err = (got.double() - want).abs().max().item()
                assert err <= 2 * RTOL[dtype] * scale, (name, block, dtype, err)


@pytest.mark.parametrize("est", SUPPORTED, ids=lambda e: e.name)
def test_packed_sort_path_matches_reference(est):
    """BLOCK=64/128 (a group across threads): float64 (two packed sorts) and a narrower dtype
    (one packed sort), ragged groups with ties."""
    generator = torch.Generator().manual_seed(4000 + est.code)
    narrow = (torch.float32, torch.float16, torch.bfloat16)[est.code % 3]
    for dtype, sizes in ((torch.float64, [40, 1, 64, 33, 0, 7]), (narrow, [100, 3, 65])):
        values = make_rewards(sizes, est, dtype, generator, tied_fraction=0.7)
        deltas = make_deltas(values, est, generator)
        assert_matches_reference(values, packed_offsets(sizes), deltas, 4, est, mode="clamp",
                                 clamp_delta=0.1 if deltas is not None else None)


@pytest.mark.parametrize("block_sizes", [[7, 9, 5], [40, 33, 64]], ids=["thread-per-group", "group-across-threads"])
def test_float64_sort_resolves_near_ties(block_sizes):
    """Values one ulp apart, negative values and signed zeros sort by value: the float64 packed sort
    (two passes over the low and high key halves) compares all 64 bits in both layouts."""
    generator = torch.Generator().manual_seed(11)
    parts = []
    for g, n in enumerate(block_sizes):
        steps = torch.randperm(n, generator=generator).double()  # shuffled 0..n-1
        if g == 0:
            parts.append(1.0 + steps * 2.0 ** -52)  # consecutive doubles: equal high 32 bits
        elif g == 1:
            parts.append(-3.0 + steps * 2.0 ** -51)
        else:
            signed_zero = torch.where(steps % 2 == 0, -0.0, 0.0).double()
            parts.append(torch.where(steps % 3 == 0, signed_zero, (steps - n / 2) * 2.0 ** -1000))
    values = torch.cat(parts).to(DEVICE)
    offsets = packed_offsets(block_sizes)
    # shift-invariant estimators whose outputs are the gaps themselves: a misordered pair of
    # near-ties changes them at their own (ulp) scale
    for name, k in (("maxk_loo1", 2), ("maxk_loo1", 3), ("tang_loo", 1), ("bon_max_second", 1)):
        est = estimators.get(name)
        args = (values, offsets, None, k, est.code, None, -math.inf, math.inf, False, 0, 1e-6)
        out = bk_triton.advantages_packed(*args, max(block_sizes))
        ref = reference.advantages_packed(*args)
        start = 0
        for n in block_sizes:
            scale = ref[start:start + n].abs().max().item()
            assert scale > 0
            err = (out[start:start + n] - ref[start:start + n]).abs().max().item()
            assert err <= 1e-9 * scale, (name, k, n, err, scale)
            start += n


def test_block_does_not_change_results():
    """A larger max_group_size (another bucket, another sort) gives the same values."""
    est = estimators.get("maxk_loo1")
    generator = torch.Generator().manual_seed(5)
    sizes = [5, 9, 1, 12]
    values = make_rewards(sizes, est, torch.float64, generator)
    offsets = packed_offsets(sizes)
    args = (values, offsets, None, 3, est.code, None, -math.inf, math.inf, True, 2, 1e-6)
    small = bk_triton.advantages_packed(*args, 12)
    unknown = bk_triton.advantages_packed(*args, None)
    large = bk_triton.advantages_packed(*args, 100)
    torch.testing.assert_close(small, unknown, rtol=0, atol=0)
    torch.testing.assert_close(small, large, rtol=1e-14, atol=1e-14)


def test_clip_and_eps_are_exact_float64():
    """Float options reach the kernel as float64 (the interpreter would round them to float32)."""
    est = estimators.get("dr_grpo")  # x - mean: -0.35, 0.25, -0.1, 0.45, -0.25
    values = torch.tensor([0.1, 0.7, 0.35, 0.9, 0.2], dtype=torch.float64, device=DEVICE)
    offsets = packed_offsets([5])
    args = (values, offsets, None, 2, est.code, None, -0.3, 0.3, True, 0, 1e-6)
    out = bk_triton.advantages_packed(*args, 5)
    torch.testing.assert_close(out, reference.advantages_packed(*args), rtol=0, atol=1e-15)
    assert (out == -0.3).any() and (out == 0.3).any()


def test_empty_batch_and_empty_groups():
    est = estimators.get("maxk")
    for sizes in ([], [0, 0]):
        values = torch.zeros(0, dtype=torch.float32, device=DEVICE)
        out = bk_triton.advantages_packed(values, packed_offsets(sizes), None, 1, est.code, None,
                                          -math.inf, math.inf, True, 1, 1e-6, 0)
        assert out.shape == (0,) and out.dtype == torch.float32


# ---------------------------------------------------------------- through the public API

def test_public_api_padded_lengths_and_group_ids():
    generator = torch.Generator().manual_seed(7)
    rewards = torch.randn(6, 10, generator=generator, dtype=torch.float32).to(DEVICE)
    lengths = torch.tensor([10, 3, 1, 7, 0, 9], device=DEVICE)
    for name in ("maxk_loo1", "grpo", "tang_loo"):
        a = bk.advantages(rewards, 3, name, lengths=lengths, backend="triton", small_groups="zero")
        b = bk.advantages(rewards, 3, name, lengths=lengths, backend="torch", small_groups="zero")
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    ids = (torch.randint(0, 5, (40,), generator=generator) * 7 - 3).to(DEVICE)
    flat = torch.rand(40, generator=generator, dtype=torch.float64).to(DEVICE)
    a = bk.advantages(flat, 2, "maxk", group_ids=ids, backend="triton", small_groups="clamp")
    b = bk.advantages(flat, 2, "maxk", group_ids=ids, backend="torch", small_groups="clamp")
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


BANKED = [e for e in SUPPORTED if e.name in tables.BANK_ESTIMATORS]


@pytest.mark.parametrize("est", BANKED, ids=lambda e: e.name)
def test_public_api_single_k_reads_a_bank(est, monkeypatch):
    """bk.advantages hands the kernel one k's tables as a bank (tables.single_k_bank) on a full
    [G, n] layout and on a ragged one with a bound; both equal the reference, in every small-group
    mode that has a k to use."""
    from bonkernels.triton import advantages as launcher

    banked = []
    arguments = launcher.PreparedLaunch.arguments

    def spy(self, values, offsets, deltas, out, bank, bank_index, *rest):
        banked.append(bank is not None)
        return arguments(self, values, offsets, deltas, out, bank, bank_index, *rest)

    monkeypatch.setattr(launcher.PreparedLaunch, "arguments", spy)
    generator = torch.Generator().manual_seed(9000 + est.code)
    rewards = make_rewards([16] * 6, est, torch.float32, generator).view(6, 16)
    lengths = torch.tensor([16, 4, 9, 1, 13, 16], device=DEVICE)
    for k in (1, 2, 5):
        for mode in ("zero", "clamp"):
            kw = dict(small_groups=mode, deltas=None)
            if est.needs_deltas:
                kw["deltas"] = (torch.rand(6, 16, generator=generator) - 0.5).to(DEVICE)
            for layout in (dict(), dict(lengths=lengths, max_group_size=16)):
                a = bk.advantages(rewards, k, est.name, backend="triton", **layout, **kw)
                b = bk.advantages(rewards, k, est.name, backend="torch", **layout, **kw)
                torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6,
                                           msg=f"k={k} {mode} {sorted(layout)}")
    assert banked and all(banked), banked


@pytest.mark.parametrize("name", ["maxk_loo1", "maxk_offpolicy", "grpo", "bon_mean"])
def test_prepared_call_equals_advantages(name):
    """bk.prepare_advantages on the Triton backend: the same values as bk.advantages with checks
    off, for several batch sizes (one plan, no new checks per call)."""
    est = estimators.get(name)
    generator = torch.Generator().manual_seed(77)
    clamp = 0.2 if est.needs_deltas else None
    plan = bk.prepare_advantages(3, name, group_size=16, backend="triton", clamp_delta=clamp,
                                 device=DEVICE)
    for G in (1, 40):
        rewards = torch.rand(G, 16, generator=generator).to(DEVICE)
        deltas = ((torch.rand(G, 16, generator=generator) - 0.5) * 0.5).to(DEVICE) \
            if est.needs_deltas else None
        want = bk.advantages(rewards, 3, name, deltas=deltas, clamp_delta=clamp, backend="triton",
                             check_inputs=False, max_group_size=16)
        assert torch.equal(plan(rewards, deltas), want)


def test_public_api_options():
    generator = torch.Generator().manual_seed(8)
    binary = (torch.rand(5, 8, generator=generator) < 0.3).double().to(DEVICE)
    binary[0] = 0.0  # every sample fails: bon_rlb's default clip bounds the infinite weight
    a = bk.advantages(binary, 3, "bon_rlb", backend="triton")
    b = bk.advantages(binary, 3, "bon_rlb", backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert a[0].eq(estimators.BON_RLB_DEFAULT_CLIP[1]).all()
    rewards = torch.rand(4, 6, generator=generator, dtype=torch.float64).to(DEVICE)
    deltas = torch.rand(4, 6, generator=generator, dtype=torch.float64).to(DEVICE) - 0.5
    for scale in ("sum", "mean"):
        a = bk.advantages(rewards, 2, "maxk_offpolicy", deltas=deltas, clamp_delta=0.25,
                          clip=(-0.4, 0.4), scale=scale, backend="triton")
        b = bk.advantages(rewards, 2, "maxk_offpolicy", deltas=deltas, clamp_delta=0.25,
                          clip=(-0.4, 0.4), scale=scale, backend="torch")
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_offpolicy_exact_is_refused():
    values = torch.rand(8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="maxk_offpolicy_exact"):
        bk_triton.advantages_packed(values, packed_offsets([8]), values * 0, 2,
                                    estimators.get("maxk_offpolicy_exact").code, None, -math.inf,
                                    math.inf, True, 0, 1e-6, 8)


def test_group_larger_than_max_block_is_refused():
    values = torch.rand(_config.MAX_BLOCK + 1, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        bk_triton.advantages_packed(values, packed_offsets([values.numel()]), None, 2, 0, None,
                                    -math.inf, math.inf, True, 0, 1e-6, None)


# ---------------------------------------------------------------- the thread-per-group sort itself

@triton.jit
def _lane_sort_probe(keys_ptr, keys_out_ptr, items_out_ptr, GROUPS: tl.constexpr,
                     BLOCK: tl.constexpr, LOG2_BLOCK: tl.constexpr):
    """_lane_sort of a [GROUPS, BLOCK] tile of keys, the columns as items."""
    at = tl.arange(0, GROUPS)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    cols = tl.zeros([GROUPS, BLOCK], dtype=tl.int32) + tl.arange(0, BLOCK)[None, :]
    keys, items = _kernel._lane_sort(tl.load(keys_ptr + at), cols, LOG2_BLOCK)
    tl.store(keys_out_ptr + at, keys)
    tl.store(items_out_ptr + at, items)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=("fp32", "fp64"))
def test_lane_sort_sorts_and_moves_the_columns_alike(dtype):
    """_lane_sort on its own, every block a thread can hold: keys ascending, and the items a
    permutation that carries each key's column (ties in any order among themselves). Rows with
    ties, signed zeros, negatives, near-ties one ulp apart, +inf padding, and already sorted or
    reversed rows."""
    generator = torch.Generator().manual_seed(21)
    for log2_block in range(0, 7):
        block = 1 << log2_block
        rows = [torch.randn(block, generator=generator, dtype=torch.float64),
                torch.randint(0, 3, (block,), generator=generator).double() / 2.0,
                torch.where(torch.arange(block) % 2 == 0, -0.0, 0.0).double(),
                1.0 + torch.randint(0, 4, (block,), generator=generator).double() * 2.0 ** -52,
                torch.arange(block, dtype=torch.float64),
                -torch.arange(block, dtype=torch.float64),
                torch.where(torch.arange(block) >= block // 2, math.inf, -torch.rand(block, generator=generator,
                                                                                     dtype=torch.float64))]
        keys = torch.stack(rows).to(dtype).to(DEVICE)  # near-ties collapse in float32: ties then
        groups = 8  # a power of two >= the rows, padded with copies of the first
        padded = torch.cat([keys, keys[:1].expand(groups - keys.shape[0], -1)]).contiguous()
        keys_out = torch.empty_like(padded)
        items_out = torch.empty(padded.shape, dtype=torch.int32, device=DEVICE)
        _lane_sort_probe[(1,)](padded, keys_out, items_out, GROUPS=groups, BLOCK=block,
                               LOG2_BLOCK=log2_block)
        assert torch.equal(keys_out, torch.sort(padded, dim=1).values), (block, padded, keys_out)
        columns = torch.arange(block, device=DEVICE).expand(groups, -1)
        assert torch.equal(items_out.sort(dim=1).values.long(), columns), block
        assert torch.equal(torch.gather(padded, 1, items_out.long()), keys_out), block


def _zero_one_rows(block, log2_run):
    """Every row of `block` 0s and 1s whose runs of 2^log2_run columns are each sorted."""
    run = 1 << log2_run
    ones = torch.cartesian_prod(*[torch.arange(run + 1)] * (block // run)).reshape(-1, block // run)
    return (torch.arange(run)[None, None, :] >= run - ones[:, :, None]).reshape(-1, block)


def test_lane_sort_sorts_every_row_of_zeros_and_ones():
    """A network of compare-exchanges sorts (or merges) every input if and only if it sorts (or
    merges) every input of 0s and 1s (the 0-1 principle). At block 8, _lane_sort gets all 256
    rows: its network sorts. At 16, whose earlier merges work on each half as block 8's network
    does, it gets every row of two sorted halves: its last merge merges. The many ties of such
    rows check that the columns stay a permutation. (The interpreter takes about 5 ms a row at
    16: all 65,536 rows there would take minutes; block 32's 289 such rows, 15 s.)"""
    for log2_block, rows in ((3, _zero_one_rows(8, 0)), (4, _zero_one_rows(16, 3))):
        block = 1 << log2_block
        groups = 1 << (rows.shape[0] - 1).bit_length()  # a power of two: pad with the first row
        keys = torch.cat([rows, rows[:1].expand(groups - rows.shape[0], -1)]).to(torch.float32)
        keys = keys.to(DEVICE).contiguous()
        keys_out = torch.empty_like(keys)
        items_out = torch.empty(keys.shape, dtype=torch.int32, device=DEVICE)
        _lane_sort_probe[(1,)](keys, keys_out, items_out, GROUPS=groups, BLOCK=block,
                               LOG2_BLOCK=log2_block)
        assert torch.equal(keys_out, torch.sort(keys, dim=1).values), block
        columns = torch.arange(block, device=DEVICE).expand(groups, -1)
        assert torch.equal(items_out.sort(dim=1).values.long(), columns), block
        assert torch.equal(torch.gather(keys, 1, items_out.long()), keys_out), block


# ---------------------------------------------------------------- against the brute-force oracle

@pytest.mark.parametrize("est", SUPPORTED, ids=lambda e: e.name)
def test_matches_the_enumeration_oracle(est):
    """Independent of the reference: python_tests/oracle.py enumerates every k-subset exactly."""
    import oracle

    generator = torch.Generator().manual_seed(6000 + est.code)
    sizes = [5, 1, 7, 3, 6]
    k = 2
    values = make_rewards(sizes, est, torch.float64, generator, tied_fraction=0.5)
    deltas = make_deltas(values, est, generator)
    clamp = 0.15 if deltas is not None else None
    clip = default_clip(est)
    for scale in ("sum", "mean"):
        out = bk_triton.advantages_packed(values, packed_offsets(sizes), deltas, k, est.code, clamp,
                                          clip[0], clip[1], scale == "mean", MODES["zero"], 1e-6,
                                          max(sizes)).cpu()
        start = 0
        for n in sizes:
            g = values[start:start + n].cpu().tolist()
            if est.uses_k and k > oracle.k_max(est.name, n):
                want = [0.0] * n  # small_groups="zero"
            else:
                d = deltas[start:start + n].cpu().tolist() if deltas is not None else None
                want = [float(w) for w in oracle.expected(est.name, g, k, scale, deltas=d,
                                                           clamp_delta=clamp, clip=clip)]
            want = torch.tensor(want, dtype=torch.float64)
            got = out[start:start + n]
            tol = 1e-9 * max(want.abs().max().item(), max(abs(x) for x in g), 1e-300)
            assert (got - want).abs().max().item() <= tol, (est.name, scale, g, got, want)
            start += n
