"""bonkernels.loss.policy_loss: value and gradient against a plain autograd reference written here.

The reference below is independent of bonkernels/loss.py: it follows the textbook formulas (PPO
clipped objective, k3 KL, verl's loss aggregations with explicit per-row loops) and lets torch
autograd differentiate it, with the advantages computed from detached sequence log-ratios.
"""

import math

import pytest
import torch

import bonkernels as bk
from bonkernels.loss import policy_loss

BACKENDS = ["torch", "chunked"]


def _batch(B, T, dtype=torch.float64, seed=0, spread=0.3, empty_rows=(), binary=False):
    gen = torch.Generator().manual_seed(seed)
    logp = (-1.0 + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)).to(dtype)
    old = (logp.double() + spread * torch.randn(B, T, generator=gen, dtype=torch.float64)).to(dtype)
    ref = (logp.double() + spread * torch.randn(B, T, generator=gen, dtype=torch.float64)).to(dtype)
    mask = torch.rand(B, T, generator=gen) > 0.3
    mask[:, 0] = True
    for r in empty_rows:
        mask[r] = False
    if binary:
        rewards = (torch.rand(B, generator=gen) > 0.5).double()
    else:
        rewards = torch.rand(B, generator=gen, dtype=torch.float64)
    return logp, old, ref, mask, rewards


def reference_loss(logp, old, rewards, k, estimator, *, mask, offsets, ref=None, kl_coef=0.0,
                   clip=(0.2, 0.2), clamp_delta=None, weighting="ppo", loss_agg="token_mean", eps=1e-6):
    """Textbook per-token loss; differentiate it with torch autograd."""
    B, T = logp.shape
    m = mask.to(torch.float64)
    lp = torch.where(mask, logp.double(), torch.zeros((), dtype=torch.float64))
    o = torch.where(mask, old.double(), torch.zeros((), dtype=torch.float64))
    deltas = None
    if estimator.startswith("maxk_offpolicy"):
        seq_lr = ((lp.detach() - o) * m).sum(-1)
        deltas = torch.exp(seq_lr) - 1.0
        if clamp_delta is not None:
            deltas = deltas.clamp(-clamp_delta, clamp_delta)
    A = bk.advantages(rewards.double(), k, estimator, offsets=offsets, deltas=deltas, scale="mean",
                      eps=eps, backend="torch")[:, None]
    if weighting == "ppo":
        ratio = torch.exp(lp - o)
        per_tok = -torch.min(ratio * A, ratio.clamp(1 - clip[0], 1 + clip[1]) * A)
    else:
        per_tok = -A * lp
    if kl_coef:
        r = torch.where(mask, ref.double(), torch.zeros((), dtype=torch.float64))
        per_tok = per_tok + kl_coef * (torch.exp(r - lp) - (r - lp) - 1)
    per_tok = per_tok * m
    if loss_agg == "token_mean":
        return per_tok.sum() / m.sum()
    rows = []
    for i in range(B):
        n = m[i].sum()
        if n == 0:
            continue
        rows.append(per_tok[i].sum() if loss_agg == "seq_mean_token_sum" else per_tok[i].sum() / n)
    return torch.stack(rows).mean()


RAGGED = torch.tensor([0, 3, 3, 8, 10, 14])   # groups of 3, 0 (empty), 5, 2, 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
@pytest.mark.parametrize("estimator,k,weighting", [
    ("maxk_loo1", 2, "ppo"), ("grpo", 1, "ppo"), ("maxk", 2, "direct"), ("rloo", 1, "direct"),
    ("maxk_offpolicy", 2, "direct"), ("maxk_offpolicy_exact", 2, "direct"), ("tang_loo", 1, "ppo"),
])
def test_value_and_grad_match_autograd_reference(backend, loss_agg, estimator, k, weighting):
    logp, old, ref, mask, rewards = _batch(14, 11, empty_rows=(4,), spread=0.1)
    kwargs = dict(mask=mask, offsets=RAGGED, weighting=weighting, loss_agg=loss_agg)
    clamp = 0.5 if estimator == "maxk_offpolicy" else None
    x = logp.clone().requires_grad_()
    loss, stats = policy_loss(x, old, rewards, k, estimator, clamp_delta=clamp, backend=backend, **kwargs)
    (grad,) = torch.autograd.grad(loss, x)
    y = logp.clone().requires_grad_()
    expect = reference_loss(y, old, rewards, k, estimator, clamp_delta=clamp, **kwargs)
    (expect_grad,) = torch.autograd.grad(expect, y)
    torch.testing.assert_close(loss, expect, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, expect_grad, rtol=1e-12, atol=1e-13)
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("clip,check", [(0.2, True), ((0.1, 0.3), True), ((0.1, 0.3), False)])
def test_kl_penalty_and_asymmetric_clip(backend, clip, check):
    logp, old, ref, mask, rewards = _batch(12, 9, seed=3, spread=0.4)
    pair = clip if isinstance(clip, tuple) else (clip, clip)
    x = logp.clone().requires_grad_()
    loss, stats = policy_loss(x, old, rewards, 3, "maxk", mask=mask, group_size=6, ref_logp=ref,
                              kl_coef=0.05, clip_eps=clip, backend=backend, check_inputs=check)
    (grad,) = torch.autograd.grad(loss, x)
    y = logp.clone().requires_grad_()
    expect = reference_loss(y, old, rewards, 3, "maxk", mask=mask, offsets=torch.tensor([0, 6, 12]),
                            ref=ref, kl_coef=0.05, clip=pair)
    (expect_grad,) = torch.autograd.grad(expect, y)
    torch.testing.assert_close(loss, expect, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grad, expect_grad, rtol=1e-12, atol=1e-13)
    # statistics, counted independently
    m = mask
    ratio = torch.exp(logp - old)
    A = bk.advantages(rewards, 3, "maxk", offsets=torch.tensor([0, 6, 12]))[:, None]
    clipped = (-A * ratio.clamp(1 - pair[0], 1 + pair[1])) > (-A * ratio)
    assert stats["clip_frac"].item() == pytest.approx((clipped & m).sum().item() / m.sum().item())
    assert stats["clip_frac"].item() > 0
    assert stats["approx_kl"].item() == pytest.approx(((old - logp)[m]).mean().item())
    d = (ref - logp)[m]
    assert stats["ref_kl"].item() == pytest.approx((d.exp() - d - 1).mean().item())
    assert stats["adv_abs_max"].item() == pytest.approx(A.abs().max().item())
    assert stats["adv_abs_mean"].item() == pytest.approx(A.abs().mean().item())
    assert stats["objective"].item() == pytest.approx(bk.max_at_k(rewards.view(2, 6), 3).mean().item())
    assert stats["num_tokens"].item() == m.sum().item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_is_the_usual_grpo_loss(backend):
    """estimator='grpo' with k=1 reproduces the hand-written GRPO loss (z-scored rewards, PPO clip)."""
    B, n = 12, 4
    logp, old, _, mask, rewards = _batch(B, 7, seed=5)
    g = rewards.view(-1, n)
    A = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).reshape(B, 1)
    ratio = torch.exp(logp - old)
    tok = -torch.min(ratio * A, ratio.clamp(0.8, 1.2) * A)
    expect = ((tok * mask).sum(-1) / mask.sum(-1)).mean()        # TRL's loss_type="grpo"
    loss, _ = policy_loss(logp, old, rewards, 1, "grpo", mask=mask, group_size=n, eps=1e-4,
                          loss_agg="seq_mean_token_mean", backend=backend)
    torch.testing.assert_close(loss, expect, rtol=1e-12, atol=1e-13)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_matches_verl_policy_loss():
    """Same loss as verl's compute_policy_loss_vanilla + agg_loss given the same advantages."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    logp, old, _, mask, rewards = _batch(16, 10, seed=7, spread=0.4, empty_rows=(5,))
    A = bk.advantages(rewards, 2, "maxk_loo1", group_ids=torch.arange(16) % 4)
    for agg, verl_agg in [("token_mean", "token-mean"), ("seq_mean_token_sum", "seq-mean-token-sum"),
                          ("seq_mean_token_mean", "seq-mean-token-mean")]:
        loss, stats = policy_loss(logp, old, rewards, 2, "maxk_loo1", mask=mask, group_ids=torch.arange(16) % 4,
                                  loss_agg=agg)
        adv = A[:, None].expand_as(logp) * mask
        expect, clipfrac, ppo_kl, _ = core_algos.compute_policy_loss(
            old, logp, adv, mask.double(), cliprange=0.2, clip_ratio_c=1e9, loss_agg_mode=verl_agg)
        torch.testing.assert_close(loss, expect, rtol=1e-7, atol=1e-9)
        # verl's masked_mean divides by (count + 1e-8)
        torch.testing.assert_close(stats["clip_frac"], clipfrac.to(torch.float64), rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(stats["approx_kl"], ppo_kl, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_weighting_gradient_is_minus_advantage(backend):
    logp, old, _, mask, rewards = _batch(8, 6, seed=11)
    x = logp.clone().requires_grad_()
    loss, _ = policy_loss(x, old, rewards, 2, "maxk_offpolicy", mask=mask, group_size=4,
                          weighting="direct", loss_agg="seq_mean_token_sum", backend=backend)
    loss.backward()
    seq_lr = ((logp - old) * mask).sum(-1)
    A = bk.advantages(rewards, 2, "maxk_offpolicy", offsets=torch.tensor([0, 4, 8]), deltas=torch.expm1(seq_lr))
    expect = (-A[:, None] / 8.0) * mask     # no ratio factor: the weights already carry it
    torch.testing.assert_close(x.grad, expect, rtol=1e-12, atol=1e-14)
    # i.e. minus the spec's sum-scale estimator, averaged over the G = 2 groups
    A_sum = bk.advantages(rewards, 2, "maxk_offpolicy", offsets=torch.tensor([0, 4, 8]),
                          deltas=torch.expm1(seq_lr), scale="sum")
    torch.testing.assert_close(x.grad.sum(-1) / mask.sum(-1), -A_sum / 2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_output_scaling_and_no_grad(backend):
    logp, old, _, mask, rewards = _batch(8, 6, seed=2)
    x = logp.clone().requires_grad_()
    loss, _ = policy_loss(x, old, rewards, 2, mask=mask, group_size=4, backend=backend)
    (3.0 * loss).backward()
    y = logp.clone().requires_grad_()
    loss1, _ = policy_loss(y, old, rewards, 2, mask=mask, group_size=4, backend=backend)
    loss1.backward()
    torch.testing.assert_close(x.grad, 3.0 * y.grad)
    plain, _ = policy_loss(logp, old, rewards, 2, mask=mask, group_size=4, backend=backend)
    assert not plain.requires_grad and plain.item() == pytest.approx(loss.item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_fused_matches_reference(dtype):
    logp, old, ref, mask, rewards = _batch(16, 33, dtype=dtype, seed=4)
    out = {}
    for backend in BACKENDS:
        x = logp.clone().requires_grad_()
        loss, _ = policy_loss(x, old, rewards, 2, mask=mask, group_size=8, ref_logp=ref, kl_coef=0.1,
                              backend=backend)
        loss.backward()
        assert loss.dtype == dtype and x.grad.dtype == dtype
        out[backend] = (loss.float(), x.grad.float())
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out["chunked"][0], out["torch"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(out["chunked"][1], out["torch"][1], rtol=tol, atol=tol * 1e-2)


def test_large_log_ratio_is_finite():
    """A token with a huge log-ratio neither overflows the loss nor gives NaN gradients."""
    logp, old, _, mask, rewards = _batch(4, 5, seed=1)
    old[0, 0] = logp[0, 0] - 200.0       # ratio e^200 on a valid token
    ref = logp.clone()
    ref[1, 0] = logp[1, 0] + 300.0       # KL term exp(300)
    out = {}
    for backend in BACKENDS:
        x = logp.clone().requires_grad_()
        loss, _ = policy_loss(x, old, rewards, 2, mask=mask, group_size=4, ref_logp=ref, kl_coef=0.1,
                              backend=backend)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
        out[backend] = (loss.detach(), x.grad)
    torch.testing.assert_close(out["chunked"][0], out["torch"][0], rtol=1e-12, atol=0)
    torch.testing.assert_close(out["chunked"][1], out["torch"][1], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("backend", BACKENDS)
def test_all_zero_mask_row_and_all_zero_mask(backend):
    logp, old, _, mask, rewards = _batch(8, 6, seed=9, empty_rows=(2,))
    for agg in ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]:
        x = logp.clone().requires_grad_()
        loss, stats = policy_loss(x, old, rewards, 2, mask=mask, group_size=4, loss_agg=agg, backend=backend)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and (x.grad[2] == 0).all()
        # dropping the empty row's tokens changes nothing: the row is simply not counted
        assert all(torch.isfinite(v) for v in stats.values())
    x = logp.clone().requires_grad_()
    loss, stats = policy_loss(x, old, rewards, 2, mask=torch.zeros_like(mask), group_size=4, backend=backend)
    loss.backward()
    assert loss.item() == 0.0 and (x.grad == 0).all()
    assert stats["clip_frac"].item() == 0.0 and stats["num_tokens"].item() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_outside_mask_is_ignored(backend):
    logp, old, ref, mask, rewards = _batch(8, 6, seed=12)
    clean_loss, _ = policy_loss(logp, old, rewards, 2, mask=mask, group_size=4, ref_logp=ref, kl_coef=0.1,
                                backend=backend)
    logp2, old2, ref2 = logp.clone(), old.clone(), ref.clone()
    for t in (logp2, old2, ref2):
        t[~mask] = float("nan")
    for check in (True, False):
        x = logp2.clone().requires_grad_()
        loss, _ = policy_loss(x, old2, rewards, 2, mask=mask, group_size=4, ref_logp=ref2, kl_coef=0.1,
                              backend=backend, check_inputs=check)
        loss.backward()
        assert loss.item() == pytest.approx(clean_loss.item(), rel=1e-12)
        assert torch.isfinite(x.grad).all()


def test_nan_inside_mask_is_an_error():
    logp, old, _, mask, rewards = _batch(8, 6, seed=12)
    bad = logp.clone()
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"logp\[3, 0\].*not finite"):
        policy_loss(bad, old, rewards, 2, mask=mask, group_size=4)
    bad_old = old.clone()
    bad_old[1, 0] = float("inf")
    with pytest.raises(ValueError, match=r"old_logp\[1, 0\]"):
        policy_loss(logp, bad_old, rewards, 2, mask=mask, group_size=4)
    bad_r = rewards.clone()
    bad_r[0] = float("nan")
    with pytest.raises(ValueError, match="rewards"):
        policy_loss(logp, old, bad_r, 2, mask=mask, group_size=4)


def test_bad_arguments_raise_clear_errors():
    logp, old, ref, mask, rewards = _batch(8, 6)
    g = dict(group_size=4)
    cases = [
        (dict(old_logp=old[:, :5]), ValueError, "old_logp must have the shape"),
        (dict(rewards=rewards[:7]), ValueError, "rewards must be 1-D"),
        (dict(mask=mask[:4]), ValueError, "mask must have the shape"),
        (dict(ref_logp=ref[:, :2], kl_coef=0.1), ValueError, "ref_logp must have the shape"),
        (dict(kl_coef=0.1), ValueError, "kl_coef > 0 needs ref_logp"),
        (dict(kl_coef=-1.0, ref_logp=ref), ValueError, "kl_coef"),
        (dict(estimator="maxk_offpolicy"), ValueError, "weighting='direct'"),
        (dict(clamp_delta=0.2), ValueError, "clamp_delta only applies"),
        (dict(estimator="maxk_offpolicy", weighting="direct", clamp_delta=-1.0), ValueError, "clamp_delta"),
        (dict(weighting="reinforce"), ValueError, "weighting must be"),
        (dict(loss_agg="token-mean"), ValueError, "loss_agg must be"),
        (dict(backend="cuda"), ValueError, "unknown backend"),
        (dict(clip_eps=(0.2,)), ValueError, "clip_eps"),
        (dict(clip_eps=-0.1), ValueError, "clip_eps"),
        (dict(estimator="nope"), ValueError, "unknown estimator"),
        (dict(k=0), ValueError, "k"),
        (dict(k=2.0), TypeError, "k must be"),
        (dict(k=5), ValueError, "k = 5"),
        (dict(mask=mask.double() * 0.5), ValueError, "mask must hold only 0 and 1"),
        (dict(estimator="passk"), ValueError, "binary"),
    ]
    for override, exc, msg in cases:
        args = dict(logp=logp, old_logp=old, rewards=rewards, k=2, mask=mask)
        args.update(g)
        args.update(override)
        with pytest.raises(exc, match=msg):
            policy_loss(args.pop("logp"), args.pop("old_logp"), args.pop("rewards"), args.pop("k"), **args)
    with pytest.raises(ValueError, match="exactly one of offsets, group_size, group_ids"):
        policy_loss(logp, old, rewards, 2, mask=mask)
    with pytest.raises(ValueError, match="exactly one of"):
        policy_loss(logp, old, rewards, 2, mask=mask, group_size=4, offsets=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="does not divide"):
        policy_loss(logp, old, rewards, 2, mask=mask, group_size=3)
    with pytest.raises(ValueError, match="logp must be 2-D"):
        policy_loss(logp[0], old[0], rewards, 2, group_size=4)
    with pytest.raises(ValueError, match="offsets must end"):
        policy_loss(logp, old, rewards, 2, offsets=torch.tensor([0, 4, 7]))


def test_offpolicy_overflow_needs_clamp_delta():
    logp, old, _, mask, rewards = _batch(8, 6)
    old = old.clone()
    old[0] -= 400.0                      # exp(sum of log-ratios) overflows
    with pytest.raises(ValueError, match="clamp_delta"):
        policy_loss(logp, old, rewards, 2, "maxk_offpolicy", mask=mask, group_size=4, weighting="direct")
    loss, _ = policy_loss(logp, old, rewards, 2, "maxk_offpolicy", mask=mask, group_size=4, weighting="direct",
                          clamp_delta=0.5)
    assert math.isfinite(loss.item())


def test_objective_stat_skips_empty_groups_and_lowers_k():
    logp, old, _, mask, rewards = _batch(14, 4, seed=21)
    _, stats = policy_loss(logp, old, rewards, 3, "grpo", mask=mask, offsets=RAGGED)
    per_group = []
    for a, b in zip(RAGGED[:-1].tolist(), RAGGED[1:].tolist()):
        if b > a:
            g = sorted(rewards[a:b].tolist())
            kk = min(3, len(g))
            subsets = [max(c) for c in __import__("itertools").combinations(g, kk)]
            per_group.append(sum(subsets) / len(subsets))
    assert stats["objective"].item() == pytest.approx(sum(per_group) / len(per_group), rel=1e-12)


def test_old_cpu_backend_name_is_the_chunked_backend_with_a_warning():
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(8, 5, generator=gen, dtype=torch.float64)
    old = logp - 0.01
    rewards = torch.rand(8, generator=gen, dtype=torch.float64)
    want, _ = policy_loss(logp, old, rewards, 2, group_size=4, backend="chunked")
    with pytest.warns(DeprecationWarning, match="'chunked'"):
        got, _ = policy_loss(logp, old, rewards, 2, group_size=4, backend="cpu")
    assert torch.equal(got, want)
