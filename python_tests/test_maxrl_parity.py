"""bonkernels' maxrl against independent re-statements of the MaxRL implementations others ship.

Each re-statement below is written from the published description of that implementation's
behaviour (not copied). Conventions differ only at the edges:

* the authors' training code: (r - m) / (m + eps), eps = 1e-6, and a singleton group's mean is
  taken as 0, so a singleton gets r / eps;
* prime-rl: (r - m) / m in float32, all zeros when m <= 0; a singleton gets 0 (a change to give it
  its raw reward has been proposed);
* SkyRL: (r - m) / (m + eps), eps = 1e-6, for groups of two or more; a singleton gets its raw reward.

bonkernels: (r - m) / m, 0 when m == 0, a singleton gets 0 (docs/spec.md section 12 says why).
On groups of size >= 2 with m > 0 all agree up to the eps term (relative eps / m).
"""

from __future__ import annotations

import torch

import bonkernels as bk

EPS = 1e-6


def authors_form(groups):
    out = []
    for r in groups:
        m = r.mean() if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
        out.append((r - m) / (m + EPS))
    return out


def prime_rl_form(groups):
    out = []
    for r in groups:
        r32 = r.to(torch.float32)
        m = r32.mean()
        out.append(torch.zeros_like(r32) if m <= 0 else (r32 - m) / m)
    return out


def skyrl_form(groups):
    out = []
    for r in groups:
        if r.numel() == 1:
            out.append(r.clone())
        else:
            m = r.mean()
            out.append((r - m) / (m + EPS))
    return out


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = []
    for n in (2, 3, 4, 8, 16, 5):
        groups.append((torch.rand(n, generator=g, dtype=torch.float64) > 0.5).to(torch.float64))
    groups += [torch.zeros(6, dtype=torch.float64), torch.ones(4, dtype=torch.float64),
               torch.rand(7, generator=g, dtype=torch.float64)]                 # continuous, >= 0
    return groups


def _ours(groups):
    values = torch.cat(groups)
    offsets = torch.tensor([0] + [int(x) for x in torch.tensor([r.numel() for r in groups]).cumsum(0)])
    a = bk.advantages(values, estimator="maxrl", offsets=offsets, backend="torch")
    return list(torch.split(a, [r.numel() for r in groups]))


def test_parity_on_groups_of_two_or_more():
    groups = _batch()
    ours = _ours(groups)
    for name, form, tol in (("authors", authors_form, 2e-5), ("prime-rl", prime_rl_form, 1e-6),
                            ("skyrl", skyrl_form, 2e-5)):
        theirs = form(groups)
        for g, (a, b) in enumerate(zip(ours, theirs)):
            m = float(groups[g].mean())
            # eps shifts the scale by a factor m / (m + eps): relative error about eps / m
            assert torch.allclose(a, b.to(torch.float64), rtol=tol, atol=tol), (name, g, a, b, m)


def test_singleton_conventions_differ_as_documented():
    groups = [torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64),
              torch.tensor([0.4], dtype=torch.float64)]
    ours = torch.cat(_ours(groups))
    assert torch.equal(ours, torch.zeros(3, dtype=torch.float64))
    assert torch.equal(torch.cat(prime_rl_form(groups)).to(torch.float64), ours)
    assert torch.equal(torch.cat(skyrl_form(groups)), torch.cat(groups))          # raw reward
    assert torch.allclose(torch.cat(authors_form(groups)), torch.cat(groups) / EPS)  # r / eps
