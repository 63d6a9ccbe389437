"""The public API: layouts, dtypes, options and every error case (the maths is in test_enumeration)."""

import math

import pytest
import torch

import bonkernels as bk
from bonkernels import estimators

BINARY = {"passk", "chen_passk", "bon_rlb", "bon_rlb_pos"}
OFFPOLICY = {"maxk_offpolicy", "maxk_offpolicy_exact"}


def rewards_for(name, shape, gen, dtype=torch.float64):
    if name in BINARY:
        return (torch.rand(shape, generator=gen) < 0.4).to(dtype)
    return torch.rand(shape, generator=gen).to(dtype)


def extra(name, shape, gen, dtype=torch.float64):
    if name in OFFPOLICY:
        return {"deltas": (torch.rand(shape, generator=gen) * 0.4 - 0.2).to(dtype)}
    return {}


@pytest.fixture
def gen():
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    return g


def ragged_batch(name, sizes, gen):
    """Packed rewards (and deltas) for groups of the given sizes."""
    N = sum(sizes)
    r = rewards_for(name, (N,), gen)
    offsets = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)), dtype=torch.int64)
    return r, offsets, extra(name, (N,), gen)


@pytest.mark.parametrize("name", bk.ESTIMATORS)
def test_layouts_agree(name, gen):
    sizes = [5, 3, 0, 7, 4, 6]
    k = 3
    r, offsets, kw = ragged_batch(name, sizes, gen)
    packed = bk.advantages(r, k, name, offsets=offsets, small_groups="zero", **kw)

    # padded [G, n] + lengths
    G, n = len(sizes), max(sizes)
    padded = torch.full((G, n), 123.0, dtype=r.dtype)
    padded_kw = {}
    if kw:
        padded_kw["deltas"] = torch.zeros(G, n, dtype=r.dtype)
    for g, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        padded[g, : b - a] = r[a:b]
        if kw:
            padded_kw["deltas"][g, : b - a] = kw["deltas"][a:b]
    lengths = torch.tensor(sizes)
    out_padded = bk.advantages(padded, k, name, lengths=lengths, small_groups="zero", **padded_kw)
    for g, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        torch.testing.assert_close(out_padded[g, : b - a], packed[a:b], rtol=1e-12, atol=1e-12)
        assert (out_padded[g, b - a:] == 0).all()

    # group ids, shuffled
    ids = torch.repeat_interleave(torch.tensor([40, 7, 99, 3, 12, 55]), lengths)
    perm = torch.randperm(r.numel(), generator=gen)
    ids_kw = {"deltas": kw["deltas"][perm]} if kw else {}
    out_ids = bk.advantages(r[perm], k, name, group_ids=ids[perm], small_groups="zero", **ids_kw)
    torch.testing.assert_close(out_ids, packed[perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", bk.ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_dtypes(name, dtype, gen):
    shape = (6, 8)
    r = rewards_for(name, shape, gen, dtype)
    kw = extra(name, shape, gen, dtype)
    out = bk.advantages(r, 3, name, **kw)
    assert out.dtype == dtype and out.shape == shape
    want = bk.advantages(r.double(), 3, name, **{a: b.double() for a, b in kw.items()})
    # computed in float64 and rounded once: within one rounding of the float64 result
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * (1 + want.abs().max().item()))


@pytest.mark.parametrize("name", bk.ESTIMATORS)
def test_scale_rule(name, gen):
    r, offsets, kw = ragged_batch(name, [4, 6, 3, 9], gen)
    # No clipping: a clip bound applies to the output in the requested scale (bon_rlb has a default).
    no_clip = (-math.inf, math.inf)
    total = bk.advantages(r, 2, name, offsets=offsets, scale="sum", clip=no_clip, **kw)
    mean = bk.advantages(r, 2, name, offsets=offsets, scale="mean", clip=no_clip, **kw)
    n = torch.repeat_interleave(offsets.diff(), offsets.diff()).double()
    finite = torch.isfinite(total)   # bon_rlb: all-fail groups are +inf before clipping
    assert torch.equal(finite, torch.isfinite(mean))
    torch.testing.assert_close(mean[finite], (n * total)[finite], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", bk.ESTIMATORS)
def test_inputs_not_modified(name, gen):
    r, offsets, kw = ragged_batch(name, [4, 6], gen)
    before = (r.clone(), offsets.clone(), {a: b.clone() for a, b in kw.items()})
    bk.advantages(r, 2, name, offsets=offsets, clamp_delta=0.05 if kw else None, **kw)
    assert torch.equal(r, before[0]) and torch.equal(offsets, before[1])
    for a in kw:
        assert torch.equal(kw[a], before[2][a])


def test_clip_and_clamp_delta(gen):
    r = torch.rand(3, 6, generator=gen, dtype=torch.float64)
    out = bk.advantages(r, 2, "grpo", clip=(-0.5, 0.25))
    assert out.max() <= 0.25 and out.min() >= -0.5
    torch.testing.assert_close(out, bk.advantages(r, 2, "grpo").clamp(-0.5, 0.25))
    deltas = torch.rand(3, 6, generator=gen, dtype=torch.float64) - 0.5
    clamped = bk.advantages(r, 2, "maxk_offpolicy", deltas=deltas, clamp_delta=0.1)
    torch.testing.assert_close(clamped, bk.advantages(r, 2, "maxk_offpolicy", deltas=deltas.clamp(-0.1, 0.1)))


def test_bon_rlb_default_clip_keeps_all_fail_groups_finite():
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    out = bk.advantages(r, 2, "bon_rlb")
    assert torch.isfinite(out).all()
    assert (out[0] == bk.BON_RLB_DEFAULT_CLIP[1]).all()
    unclipped = bk.advantages(r, 2, "bon_rlb", clip=(-math.inf, math.inf))
    assert torch.isinf(unclipped[0]).all() and torch.isfinite(unclipped[1]).all()


def test_small_groups_modes():
    r = torch.tensor([0.2, 0.9, 0.4, 0.1, 0.7], dtype=torch.float64)
    offsets = torch.tensor([0, 2, 5])
    with pytest.raises(ValueError, match="group 0"):
        bk.advantages(r, 3, "maxk", offsets=offsets)
    zero = bk.advantages(r, 3, "maxk", offsets=offsets, small_groups="zero")
    assert (zero[:2] == 0).all()
    torch.testing.assert_close(zero[2:], bk.advantages(r[2:], 3, "maxk", offsets=torch.tensor([0, 3])))
    clamp = bk.advantages(r, 3, "maxk", offsets=offsets, small_groups="clamp")
    torch.testing.assert_close(clamp[:2], bk.advantages(r[:2], 2, "maxk", offsets=torch.tensor([0, 2])))
    # leave-one-out: k <= n - 1, and a singleton group has no valid k at all
    loo = bk.advantages(torch.tensor([0.3, 0.5, 0.1]), 2, "maxk_loo", offsets=torch.tensor([0, 1, 3]),
                        small_groups="clamp")
    assert loo[0] == 0
    with pytest.raises(ValueError, match="k <= n - 1"):
        bk.advantages(torch.rand(2, 3), 3, "maxk_loo")


def test_k_ignored_estimators_accept_any_k():
    r = torch.rand(2, 3, dtype=torch.float64)
    for name in ("tang_loo", "grpo", "rloo", "dr_grpo", "bon_max_mean", "bon_max_second"):
        torch.testing.assert_close(bk.advantages(r, 50, name), bk.advantages(r, 1, name))


def test_empty_groups_and_empty_batch():
    out = bk.advantages(torch.tensor([0.5, 0.1]), 1, "maxk", offsets=torch.tensor([0, 0, 2, 2]))
    assert out.shape == (2,)
    empty = bk.advantages(torch.zeros(0), 2, "maxk_loo1", offsets=torch.tensor([0, 0]))
    assert empty.shape == (0,)
    none = bk.advantages(torch.zeros(0), 2, "maxk_loo1", offsets=torch.tensor([0]))
    assert none.shape == (0,)


def test_metrics():
    correct = torch.tensor([[1, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    torch.testing.assert_close(bk.pass_at_k(correct, 2),
                               torch.tensor([1 - math.comb(3, 2) / math.comb(5, 2), 0.0], dtype=torch.float64))
    r = torch.tensor([0.2, 0.9, 0.4], dtype=torch.float32)
    torch.testing.assert_close(bk.max_at_k(r, 2, offsets=torch.tensor([0, 3])), torch.tensor([(0.9 + 0.9 + 0.4) / 3]))
    ids = torch.tensor([5, 1, 5, 1])
    torch.testing.assert_close(bk.max_at_k(torch.tensor([1.0, 2.0, 3.0, 4.0]), 1, group_ids=ids),
                               torch.tensor([3.0, 2.0]))
    with pytest.raises(ValueError, match="binary"):
        bk.pass_at_k(torch.tensor([[0.5, 1.0]]), 1)
    with pytest.raises(ValueError, match="k <= n"):
        bk.pass_at_k(torch.tensor([[1, 0]]), 3)


def test_large_groups_stay_finite():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        r = torch.rand(2, 4096, generator=gen).to(dtype)
        deltas = (torch.rand(2, 4096, generator=gen) * 0.2 - 0.1).to(dtype)
        binary = (r > 0.97).to(dtype)
        for name in bk.ESTIMATORS:
            if name == "maxk_offpolicy_exact":
                continue
            for k in (1, 2, 16, 2048, 4095):
                kw = {"deltas": deltas} if name in OFFPOLICY else {}
                out = bk.advantages(binary if name in BINARY else r, k, name, **kw)
                assert torch.isfinite(out).all(), (name, k, dtype)


def test_offpolicy_exact_range_is_enforced():
    r = torch.rand(1, bk.reference.OFFPOLICY_EXACT_MAX_N + 1)
    with pytest.raises(ValueError, match="at most"):
        bk.advantages(r, 2, "maxk_offpolicy_exact", deltas=torch.zeros_like(r))
    with pytest.raises(ValueError, match="overflow"):
        big = torch.rand(1, 64, dtype=torch.float64)
        bk.advantages(big, 64, "maxk_offpolicy_exact", deltas=torch.full_like(big, 1e300))


# ----------------------------------------------------------------------------- errors

def test_error_messages():
    r = torch.rand(3, 4)
    cases = [
        (dict(estimator="nope"), ValueError, "unknown estimator"),
        (dict(k=0), ValueError, "k must be >= 1"),
        (dict(k=2.0), TypeError, "k must be a Python int"),
        (dict(k=5), ValueError, "group 0"),
        (dict(scale="total"), ValueError, "scale"),
        (dict(backend="gpu"), ValueError, "unknown backend"),
        (dict(small_groups="skip"), ValueError, "small_groups"),
        (dict(clip=(1.0, -1.0)), ValueError, "clip"),
        (dict(clip=3.0), ValueError, "clip"),
        (dict(estimator="maxk_offpolicy"), ValueError, "needs deltas"),
        (dict(deltas=torch.zeros(3, 4)), ValueError, "does not use deltas"),
        (dict(clamp_delta=0.1), ValueError, "clamp_delta"),
        (dict(estimator="passk"), ValueError, "binary"),
        (dict(lengths=torch.tensor([1, 2, 3]), offsets=torch.tensor([0, 4])), ValueError, "at most one"),
        (dict(lengths=torch.tensor([1, 2])), ValueError, "one entry per row"),
        (dict(lengths=torch.tensor([1, 2, 7])), ValueError, "group 2"),
        (dict(lengths=torch.tensor([1.0, 2.0, 3.0])), TypeError, "integer"),
        (dict(offsets=torch.tensor([0, 4])), ValueError, "1-D"),
        (dict(estimator="maxk_offpolicy", deltas=torch.zeros(3, 5)), ValueError, "shape"),
        (dict(estimator="maxk_offpolicy", deltas=torch.full((3, 4), -1.5)), ValueError, ">= -1"),
    ]
    for kwargs, error, match in cases:
        kwargs = dict(kwargs)
        args = dict(k=kwargs.pop("k", 2), estimator=kwargs.pop("estimator", "maxk_loo1"))
        with pytest.raises(error, match=match):
            bk.advantages(r, args["k"], args["estimator"], **kwargs)


def test_nonfinite_inputs_name_the_group():
    r = torch.rand(10, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 6, 10])
    for bad in (math.nan, math.inf, -math.inf):
        x = r.clone()
        x[7] = bad
        with pytest.raises(ValueError, match="NaN or inf in group 2"):
            bk.advantages(x, 2, offsets=offsets)
        d = torch.zeros_like(r)
        d[4] = bad
        with pytest.raises(ValueError, match="deltas contain NaN or inf in group 1"):
            bk.advantages(r, 2, "maxk_offpolicy", offsets=offsets, deltas=d)
    ids = torch.tensor([9, 9, 4, 4, 4, 9, 2, 2, 2, 2])
    x = r.clone()
    x[0] = math.nan
    with pytest.raises(ValueError, match="group id 9"):
        bk.advantages(x, 2, group_ids=ids)


def test_malformed_offsets():
    r = torch.rand(6)
    for offsets, match in [([1, 3, 6], "start at 0"), ([0, 4, 2, 6], "non-decreasing.*group 1"),
                           ([0, 3, 5], "end at N = 6"), ([0, 3, 7], "end at N")]:
        with pytest.raises(ValueError, match=match):
            bk.advantages(r, 1, offsets=torch.tensor(offsets))
    with pytest.raises(TypeError, match="integer"):
        bk.advantages(r, 1, offsets=torch.tensor([0.0, 6.0]))


def test_bad_rewards_types_and_shapes():
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        bk.advantages(torch.ones(2, 3, dtype=torch.int64), 1)
    with pytest.raises(TypeError, match="float16"):
        bk.advantages(torch.ones(2, 3, dtype=torch.bool), 1)
    with pytest.raises(TypeError, match="torch.Tensor"):
        bk.advantages([[0.1, 0.2]], 1)
    with pytest.raises(ValueError, match="2-D"):
        bk.advantages(torch.rand(5), 1)
    with pytest.raises(ValueError, match="1-D"):
        bk.advantages(torch.rand(2, 3), 1, group_ids=torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="shape of rewards"):
        bk.advantages(torch.rand(5), 1, group_ids=torch.zeros(4, dtype=torch.int64))


def test_backend_errors_are_clear():
    r = torch.rand(2, 3)
    with pytest.raises((RuntimeError, ValueError), match="backend='cuda'"):
        bk.advantages(r, 1, backend="cuda")
    with pytest.raises(ValueError, match="maxk_offpolicy_exact runs only on the torch"):
        bk.advantages(r, 1, "maxk_offpolicy_exact", deltas=torch.zeros_like(r), backend="cpu")


def test_registry_is_complete():
    assert set(bk.ESTIMATORS) == {
        "maxk", "maxk_loo", "maxk_loo_centered", "maxk_loo1", "maxk_offpolicy", "maxk_offpolicy_exact",
        "passk", "tang_loo", "bon_max_mean", "bon_max_second", "bon_mean", "chen_passk", "bon_rlb",
        "bon_rlb_pos", "grpo", "rloo", "dr_grpo", "maxrl"}
    assert len({estimators.get(n).code for n in bk.ESTIMATORS}) == len(bk.ESTIMATORS)


def test_reference_ignores_a_wrong_group_size_hint():
    r = torch.rand(4, 8, dtype=torch.float64)
    want = bk.advantages(r, 2, backend="torch")
    got = bk.advantages(r.reshape(-1), 2, offsets=torch.arange(0, 33, 8), backend="torch",
                        check_inputs=False, max_group_size=3)
    torch.testing.assert_close(got.reshape(4, 8), want)
