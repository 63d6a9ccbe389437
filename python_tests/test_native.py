"""Cross-backend tests of the compiled extension (bonkernels._C) against the float64 reference.

Every estimator the native backend implements, every layout and dtype, fresh random inputs with
group sizes 1..4096 and ragged batches (empty groups included). Outputs are poisoned (NaN) before
each run, so an element the kernel forgets to write fails the comparison.
"""

import math

import pytest
import torch

import bonkernels as bk
from bonkernels import _native, estimators, reference

pytestmark = pytest.mark.skipif(not _native.available(), reason=f"native extension not built: {_native.load_error()}")

def _reference_implements(est):
    """The reference may lag the registry by an estimator (then the native-only tests cover it)."""
    try:
        reference.advantages_packed(torch.ones(2, dtype=torch.float64), torch.tensor([0, 2]),
                                    torch.zeros(2, dtype=torch.float64), 1, est.code, None, -math.inf, math.inf,
                                    True, 2, 1e-6)
    except ValueError as error:
        if "no reference implementation" in str(error):
            return False
    return True


NATIVE = [e for e in estimators.REGISTRY.values()
          if e.code not in _native.UNSUPPORTED_CODES and _reference_implements(e)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
RAGGED = [1, 2, 3, 0, 8, 16, 31, 32, 33, 5, 64, 100, 1, 256, 0, 1024, 7, 4096]


def _rel_tol(dtype):
    return {torch.float64: 1e-10, torch.float32: 2 ** -23, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[dtype]


def make_batch(sizes, est, dtype, gen, tied=False):
    offsets = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    N = int(offsets[-1])
    if est.binary:
        values = (torch.rand(N, generator=gen, dtype=torch.float64) < 0.35).to(dtype)
    elif tied:
        values = torch.randint(0, 4, (N,), generator=gen).to(torch.float64).div(4).to(dtype)
    else:
        values = torch.randn(N, generator=gen, dtype=torch.float64).to(dtype)
    deltas = None
    if est.needs_deltas:
        deltas = ((torch.rand(N, generator=gen, dtype=torch.float64) - 0.5) * 0.6).to(dtype)
    return values, offsets, deltas


def assert_matches(got, want, dtype, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert not torch.isnan(got).any() or torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: unwritten/NaN outputs"
    g, w = got.double(), want.double()
    finite = torch.isfinite(w)
    assert torch.equal(torch.isfinite(g), finite), f"{what}: non-finite mismatch"
    assert torch.equal(g[~finite], w[~finite]), f"{what}: infinities differ"
    if finite.any():
        scale = max(1.0, float(w[finite].abs().max()))
        err = (g[finite] - w[finite]).abs()
        bound = _rel_tol(dtype) * w[finite].abs() + 1e-10 * scale
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (f"{what}: max error {float(err.max()):.3e} at {worst}: "
                                            f"got {float(g[finite][worst])}, want {float(w[finite][worst])}")


def run_both(values, offsets, deltas, k, est, *, clamp_delta=None, clip=(-math.inf, math.inf), mean_scale=True,
             small_groups=2, eps=1e-6, max_group_size=None):
    args = (values, offsets, deltas, k, est.code, clamp_delta, clip[0], clip[1], mean_scale, small_groups, eps,
            max_group_size)
    want = reference.advantages_packed(*args)
    out = torch.full_like(values, float("nan"))
    got = _native.advantages_packed(*args, out=out)
    assert got is out
    return got, want


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("est", NATIVE, ids=lambda e: e.name)
def test_ragged_batch_all_sizes(est, dtype):
    gen = torch.Generator().manual_seed(1000 + est.code * 7 + DTYPES.index(dtype))
    for k in (1, 3):
        values, offsets, deltas = make_batch(RAGGED, est, dtype, gen)
        got, want = run_both(values, offsets, deltas, k, est, clamp_delta=0.2 if est.needs_deltas else None)
        assert_matches(got, want, dtype, f"{est.name} k={k} {dtype}")


PACKED = [e for e in NATIVE if e.name in ("grpo", "rloo", "dr_grpo", "maxrl")]


@pytest.mark.parametrize("est", PACKED, ids=lambda e: e.name)
def test_groups_computed_together_equal_groups_alone(est):
    """The CPU kernel computes consecutive groups of one size up to 32 several at a time (one per
    vector lane, csrc/include/bonkernels/pack_exec.h): a group's values must not depend on its
    neighbours. Every group of a batch, to the bit, as the same group alone; batches of an odd
    count, runs of equal sizes inside ragged batches, a group with a NaN among packable ones,
    constant and extreme groups; and within tolerance of the reference."""
    gen = torch.Generator().manual_seed(4242 + est.code)
    layouts = [[n] * 15 for n in (1, 2, 5, 8, 9, 16, 17, 32)] + [[3, 3, 4, 4, 4, 33, 33, 16, 16, 1]]
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for sizes in layouts:
            values, offsets, _ = make_batch(sizes, est, dtype, gen)
            if len(sizes) == 15:
                n = sizes[0]
                values[n:2 * n] = 0.5                           # a constant group
                if dtype == torch.float64:
                    values[2 * n:3 * n] *= 1e307               # sums that overflow: the rescaled path
                values[5 * n] = float("nan")                    # a NaN group between packable ones
            for eps, mean_scale, clip in ((1e-6, True, (-math.inf, math.inf)), (0.0, False, (-0.5, 2.0))):
                args = (values, offsets, None, 1, est.code, None, clip[0], clip[1], mean_scale, 2, eps, None)
                together = _native.advantages_packed(*args)
                for g in range(len(sizes)):
                    lo, hi = int(offsets[g]), int(offsets[g + 1])
                    alone = _native.advantages_packed(values[lo:hi].clone(), torch.tensor([0, hi - lo]), *args[2:])
                    assert torch.equal(together[lo:hi].view(-1).double().nan_to_num(7.0),
                                       alone.double().nan_to_num(7.0)), (est.name, dtype, sizes, g)
                want = reference.advantages_packed(*args)
                kept = torch.ones(len(values), dtype=torch.bool)
                if len(sizes) == 15:  # (the NaN contract and the float64 limit are tested elsewhere)
                    kept[2 * sizes[0]:3 * sizes[0]] = False
                    kept[5 * sizes[0]:6 * sizes[0]] = False
                assert_matches(together[kept], want[kept], dtype, f"{est.name} {dtype} {sizes} eps={eps}")


SORTING = [e for e in NATIVE if not e.order_free]


@pytest.mark.parametrize("est", SORTING, ids=lambda e: e.name)
def test_groups_sorted_together_equal_groups_alone(est):
    """The CPU kernel sorts eight (with AVX-512), four (with AVX2) or two consecutive finite groups
    of one size up to 32 at once and computes maxk, passk, maxk_loo1 and maxk_offpolicy from a bank on all of them
    (float32, float16, bfloat16 rewards: csrc/cpu/advantages_cpu.cpp, sort_pack): every group of a
    batch, to the bit, as the same group alone, with ties, NaN, inf and signed zeros, odd counts and
    ragged runs (runs of 15 equal groups, some of them special, take packs of eight, four and two
    and groups alone; the ragged batch pairs and triples); with one k's bank, a mixture's bank and none; deltas (an inf among
    them) for the off-policy estimators; and near the reference."""
    from bonkernels import tables

    gen = torch.Generator().manual_seed(777 + est.code)
    layouts = [[n] * 15 for n in (2, 3, 7, 8, 9, 16, 17, 31, 32)] + [[4, 4, 5, 5, 5, 33, 33, 16, 16, 1, 1]]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for sizes in layouts:
            for tied in (False, True):
                values, offsets, deltas = make_batch(sizes, est, dtype, gen, tied=tied)
                n = sizes[0]
                special = len(sizes) == 15 and not est.binary
                if special:
                    values[1] = float("nan")           # a NaN in group 0: it goes alone
                    values[2 * n + 1] = float("inf")   # an inf in group 2 (groups 1, 2 alone too)
                    values[4 * n - 1] = -0.0           # signed zeros in group 3, packed with the next ones
                    values[3 * n] = 0.0
                    if deltas is not None:
                        deltas[5 * n + n // 2] = float("inf")  # an inf delta in group 5 (5, 6 alone)
                banks = [None]
                if est.name in tables.BANK_ESTIMATORS:
                    one_k = tables.single_k_bank(est.name, min(sizes), max(sizes), None, 2, "cpu")
                    mixture = tables.build_bank(est.name, (0.25, 0.0, 0.75), tuple(range(1, max(sizes) + 1)), 2, "cpu")
                    banks += [one_k, mixture]
                # (tied batches also clip, and take the other scale: the packs scale and clip all lanes at once)
                clip_lo, clip_hi, mean_scale = (0.01, 0.06, False) if tied else (-math.inf, math.inf, True)
                for bank in banks:
                    args = (values, offsets, deltas, min(sizes), est.code, 0.2 if est.needs_deltas else None,
                            clip_lo, clip_hi, mean_scale, 2, 1e-6, max(sizes))
                    extra = {} if bank is None else dict(bank=bank[0], bank_index=bank[1])
                    together = _native.advantages_packed(*args, **extra)
                    for g in range(len(sizes)):
                        lo, hi = int(offsets[g]), int(offsets[g + 1])
                        alone = _native.advantages_packed(
                            values[lo:hi].clone(), torch.tensor([0, hi - lo]),
                            None if deltas is None else deltas[lo:hi].clone(), *args[3:], **extra)
                        assert torch.equal(together[lo:hi].double().nan_to_num(7.0), alone.double().nan_to_num(7.0)), (
                            est.name, dtype, sizes, tied, bank is not None, g)
                    if bank is None or bank is banks[1]:  # (one k: the reference's call)
                        want = reference.advantages_packed(*args)
                        kept = torch.ones(len(values), dtype=torch.bool)
                        if special:  # (the NaN contract is tested elsewhere)
                            kept[:3 * n] = False
                            kept[5 * n:6 * n] = False
                        assert_matches(together[kept], want[kept], dtype, f"{est.name} {dtype} {sizes} bank={bank is not None}")


@pytest.mark.parametrize("name", ["grpo", "maxk_loo1", "maxk_offpolicy"])
def test_packs_clip_to_a_signed_zero_and_leave_odd_clamps_to_single_groups(name):
    """The packs clip all lanes at once: a clip bound of -0.0 must come out as -0.0, as the clip of a
    group alone gives it. A clamp_delta of 0 or below (the raw op takes one; the API refuses it)
    must give the values of groups computed one at a time (the packs clamp for positive ones only)."""
    from bonkernels import tables

    est = estimators.REGISTRY[name]
    gen = torch.Generator().manual_seed(31)
    sizes = [8] * 9
    values, offsets, deltas = make_batch(sizes, est, torch.float32, gen)
    values -= 0.5  # (values of both signs)
    extra = {}
    if name in tables.BANK_ESTIMATORS:
        bank, index = tables.single_k_bank(name, 2, 8, None, 2, "cpu")  # (k = 2, as the calls)
        extra = dict(bank=bank, bank_index=index)
    clamps = [0.2, 0.0, -0.1] if est.needs_deltas else [None]
    for clamp, clip in [(c, b) for c in clamps for b in ((-0.0, math.inf), (-math.inf, -0.0))]:
        args = (values, offsets, deltas, 2, est.code, clamp, clip[0], clip[1], True, 2, 1e-6, 8)
        together = _native.advantages_packed(*args, **extra)
        if clip[1] == 0:  # (every estimator here gives positive values)
            assert bool((torch.signbit(together) & (together == 0)).any()), "no value was clipped to -0.0"
        for g in range(len(sizes)):
            lo, hi = int(offsets[g]), int(offsets[g + 1])
            alone = _native.advantages_packed(values[lo:hi].clone(), torch.tensor([0, hi - lo]),
                                              None if deltas is None else deltas[lo:hi].clone(), *args[3:], **extra)
            assert torch.equal(together[lo:hi].view(torch.int32), alone.view(torch.int32)), (name, clamp, clip, g)


@pytest.mark.parametrize("est", NATIVE, ids=lambda e: e.name)
def test_every_small_size_and_k(est):
    """n = 1..40, every k up to n, ties, sum and mean scales, all three small-group modes."""
    gen = torch.Generator().manual_seed(77 + est.code)
    sizes = list(range(1, 41))
    for k in (1, 2, 3, 5, 8, 16, 40):
        for tied in (False, True):
            values, offsets, deltas = make_batch(sizes, est, torch.float64, gen, tied=tied)
            for mode in (1, 2):
                got, want = run_both(values, offsets, deltas, k, est, small_groups=mode, mean_scale=tied)
                assert_matches(got, want, torch.float64, f"{est.name} k={k} mode={mode} tied={tied}")


@pytest.mark.parametrize("est", NATIVE, ids=lambda e: e.name)
def test_clip_eps_and_clamp(est):
    gen = torch.Generator().manual_seed(5 + est.code)
    values, offsets, deltas = make_batch([4, 9, 17, 1, 40], est, torch.float32, gen)
    got, want = run_both(values, offsets, deltas, 2, est, clip=(-0.05, 0.3), eps=1e-4, mean_scale=False,
                         clamp_delta=0.05 if est.needs_deltas else None)
    assert_matches(got, want, torch.float32, est.name)


@pytest.mark.parametrize("est", NATIVE, ids=lambda e: e.name)
def test_constant_and_binary_edge_groups(est):
    """All-equal groups, all-correct / all-wrong groups, singletons: the degenerate branches."""
    parts = [torch.full((n,), v, dtype=torch.float64) for n, v in ((5, 1.0), (5, 0.0), (1, 1.0), (7, 0.3 if not est.binary else 1.0))]
    values = torch.cat(parts)
    offsets = torch.tensor([0, 5, 10, 11, 18])
    deltas = torch.linspace(-0.3, 0.3, 18, dtype=torch.float64) if est.needs_deltas else None
    for k in (1, 2, 5):
        got, want = run_both(values, offsets, deltas, k, est, clip=(-10.0, 10.0))
        assert_matches(got, want, torch.float64, f"{est.name} k={k}")


@pytest.mark.parametrize("layout", ["full", "padded", "packed", "ids"])
@pytest.mark.parametrize("name", ["maxk_loo1", "maxk_offpolicy", "bon_rlb", "grpo", "maxk_loo"])
def test_public_api_layouts(layout, name):
    """bk.advantages(backend='cpu') equals backend='torch' in every layout."""
    est = estimators.get(name)
    gen = torch.Generator().manual_seed(hash((layout, name)) % 1000)
    G, n = 6, 12
    rewards = (torch.rand(G, n, generator=gen) < 0.5).float() if est.binary else torch.randn(G, n, generator=gen)
    deltas = (torch.rand(G, n, generator=gen) - 0.5) * 0.4 if est.needs_deltas else None
    kwargs = dict(deltas=deltas, clamp_delta=0.1 if est.needs_deltas else None)
    if layout == "padded":
        kwargs["lengths"] = torch.tensor([12, 5, 3, 12, 8, 4])
    elif layout == "packed":
        kwargs["offsets"] = torch.tensor([0, 12, 17, 20, 32, 40, 44, 72])
        rewards = rewards.reshape(-1)
        if deltas is not None:
            kwargs["deltas"] = deltas.reshape(-1)
    elif layout == "ids":
        ids = torch.randint(0, 5, (G * n,), generator=gen) * 3 - 2
        kwargs["group_ids"] = ids
        rewards = rewards.reshape(-1)
        if deltas is not None:
            kwargs["deltas"] = deltas.reshape(-1)
    k = 2
    got = bk.advantages(rewards, k, name, backend="cpu", small_groups="clamp", **kwargs)
    want = bk.advantages(rewards, k, name, backend="torch", small_groups="clamp", **kwargs)
    assert_matches(got, want, torch.float32, f"{name} {layout}")


def test_auto_uses_the_native_kernel_and_matches():
    x = torch.randn(64, 16, dtype=torch.float64)
    assert torch.allclose(bk.advantages(x, 4, backend="auto"), bk.advantages(x, 4, backend="torch"), rtol=1e-10, atol=1e-12)


def test_functional_op_allocates_and_inputs_are_untouched():
    values = torch.randn(50, dtype=torch.float64)
    offsets = torch.tensor([0, 10, 10, 50])
    before = values.clone()
    out = _native.advantages_packed(values, offsets, None, 3, 3, None, -math.inf, math.inf, True, 0, 1e-6)
    assert torch.equal(values, before)
    want = reference.advantages_packed(values, offsets, None, 3, 3, None, -math.inf, math.inf, True, 0, 1e-6)
    assert_matches(out, want, torch.float64, "functional")


def test_exact_offpolicy_is_refused_clearly():
    values = torch.randn(8)
    with pytest.raises(ValueError, match="reference-only"):
        _native.advantages_packed(values, torch.tensor([0, 8]), torch.zeros(8), 2, 5, None, -math.inf, math.inf,
                                  True, 0, 1e-6)


def test_bad_inputs_raise():
    values = torch.randn(8)
    with pytest.raises(ValueError, match="malformed offsets"):
        _native.advantages_packed(values, torch.tensor([0, 9]), None, 1, 0, None, -math.inf, math.inf, True, 0, 1e-6)
    with pytest.raises(TypeError, match="int64"):
        _native.advantages_packed(values, torch.tensor([0, 8], dtype=torch.int32), None, 1, 0, None, -math.inf,
                                  math.inf, True, 0, 1e-6)
    with pytest.raises(ValueError, match="needs deltas"):
        _native.advantages_packed(values, torch.tensor([0, 8]), None, 1, 4, None, -math.inf, math.inf, True, 0, 1e-6)


def test_cuda_request_without_cuda_kernels_is_clear():
    if _native.cuda_available():
        pytest.skip("this machine has the CUDA kernels")
    with pytest.raises((RuntimeError, ValueError), match="CUDA|cuda"):
        bk.advantages(torch.randn(4, 8), 2, backend="cuda")


def test_torch_compile_fullgraph_traces_the_op():
    """torch.compile(fullgraph=True) of a function calling bk.advantages (packed, no checks)."""
    offsets = torch.tensor([0, 16, 20, 52])
    rewards = torch.randn(52, dtype=torch.float32)

    def step(r, off):
        a = bk.advantages(r, 4, "maxk_loo1", offsets=off, check_inputs=False, backend="cpu", max_group_size=32)
        return (a * 2.0).sum(), a

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    total, a = compiled(rewards, offsets)
    want = reference.advantages_packed(rewards, offsets, None, 4, 3, None, -math.inf, math.inf, True, 0, 1e-6)
    assert_matches(a, want, torch.float32, "compiled")
    assert torch.allclose(total, 2 * want.sum())


def test_fake_impl_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        v = torch.empty(10, dtype=torch.bfloat16)
        out = torch.ops.bonkernels.advantages_packed(v, torch.empty(3, dtype=torch.int64), None, 2, 0, None,
                                                     -math.inf, math.inf, True, 0, 1e-6, 8)
        assert out.shape == (10,) and out.dtype == torch.bfloat16
