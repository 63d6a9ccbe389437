"""With ``check_inputs=False`` and ``group_size``, ``bk.policy_loss`` (forward and backward) runs no
operation that would synchronise a GPU with the host, so it can be captured in a CUDA graph.
Checked on the CPU by recording every aten op the call dispatches (``bk.advantages`` has the same
check in test_api_contract.py; the GPU variants use ``torch.cuda.set_sync_debug_mode``).

Which ops sync: python_tests/sync_ops.py.
"""

from __future__ import annotations

import pytest
import torch

import bonkernels as bk
from bonkernels import _native
from sync_ops import Recorder


def _record(fn):
    fn()                                  # warm caches (weight tables, banks) outside the recording
    with Recorder() as rec:
        fn()
    return rec


def test_the_recorder_sees_syncs():
    with Recorder() as rec:
        t = torch.rand(5)
        bool((t > 2).any())
        t[t > 0.5]
    assert rec.syncs(), rec.ops


needs_native = pytest.mark.skipif(not _native.available(), reason="native extension not built")


def test_checks_on_do_sync():
    """The counter-check: with input checks the call reads values on the host."""
    rec = _record(lambda: bk.advantages(torch.rand(8, 6), 3, "maxk_loo1"))
    assert rec.syncs()


@needs_native
@pytest.mark.parametrize("backend", ["torch", "chunked"])
@pytest.mark.parametrize("estimator,weighting", [("maxk_loo1", "ppo"), ("grpo", "ppo"),
                                                  ("maxk_offpolicy", "direct")])
def test_policy_loss_forward_and_backward_are_sync_free(backend, estimator, weighting):
    B, T = 8, 7
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(B, T, generator=gen)).requires_grad_(True)
    old = logp.detach() - 0.05 * torch.rand(B, T, generator=gen)
    ref = logp.detach() + 0.05 * torch.rand(B, T, generator=gen)
    mask = torch.rand(B, T, generator=gen) > 0.2
    rewards = torch.rand(B, generator=gen)

    def step():
        loss, stats = bk.policy_loss(logp, old, rewards, 2 if estimator != "grpo" else None, estimator,
                                     mask=mask, group_size=4, ref_logp=ref, kl_coef=0.01, weighting=weighting,
                                     clamp_delta=0.5 if weighting == "direct" else None, backend=backend,
                                     check_inputs=False)
        loss.backward()
        return stats

    rec = _record(step)
    assert rec.syncs() == [], rec.ops
