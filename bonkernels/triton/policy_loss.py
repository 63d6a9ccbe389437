"""Fused Triton kernel of the policy loss: forward and backward in one pass over the tokens.

One program handles ``BLOCK_T`` tokens of one sequence. It reads each input once (log-probs,
old log-probs, optional reference log-probs and mask, plus the row's advantage and aggregation
weight), writes the gradient w.r.t. ``logp`` once, and writes its partial sums of the loss and of
the statistics; the host adds the partials (deterministic, no atomics). The backward pass only
scales the stored gradient when the caller's ``grad_output`` is not 1.

The per-token math is the one in ``bonkernels/loss_math.py`` (``reference_loss`` / ``token_terms``).
"""

from __future__ import annotations

import os
import struct

import torch

from ..loss_math import LOG_RATIO_LIMIT, STAT_SUMS, SavedGradientLoss
from ._config import device_guard

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is optional
    triton = None
    tl = None

_NUM_PARTIALS = 1 + len(STAT_SUMS)  # the loss, then the statistic sums


def float64_bits(x: float) -> int:
    """The IEEE float64 bit pattern of x as a signed int64 (the kernel's float scalar arguments)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def require(logp: torch.Tensor) -> None:
    """Raise a clear error when the Triton path cannot run on ``logp``."""
    if triton is None:
        raise RuntimeError("backend='triton' needs the triton package (pip install triton)")
    if logp.is_cuda:
        return
    if not interpreting():
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                         f"importing triton, for CPU tensors); logp is on {logp.device}")


if triton is not None:
    _LIMIT = tl.constexpr(LOG_RATIO_LIMIT)

    # One compilation per dtype and flag set: the sequence length, the block count and the strides
    # are plain runtime integers (no specialisation on 1 or on multiples of 16), the pointers are
    # not specialised on alignment, and BLOCK_T is fixed (longer rows use more programs).
    @triton.jit(do_not_specialize=["T", "n_blocks", "s_logp", "s_old", "s_ref", "s_mask", "s_grad",
                                   "clip_lo_bits", "clip_hi_bits", "kl_coef_bits"],
                do_not_specialize_on_alignment=["logp_ptr", "old_ptr", "ref_ptr", "mask_ptr",
                                                "adv_ptr", "roww_ptr", "grad_ptr", "part_ptr"])
    def _policy_loss_kernel(logp_ptr, old_ptr, ref_ptr, mask_ptr, adv_ptr, roww_ptr, grad_ptr, part_ptr,
                            T, n_blocks, s_logp: tl.int64, s_old: tl.int64, s_ref: tl.int64,
                            s_mask: tl.int64, s_grad: tl.int64, clip_lo_bits: tl.int64,
                            clip_hi_bits: tl.int64, kl_coef_bits: tl.int64,
                            PPO: tl.constexpr, HAS_REF: tl.constexpr, HAS_MASK: tl.constexpr,
                            USE_KL: tl.constexpr, WRITE_GRAD: tl.constexpr, FP64: tl.constexpr,
                            BLOCK_T: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        cols = blk * BLOCK_T + tl.arange(0, BLOCK_T)
        inb = cols < T
        if FP64:
            acc_t = tl.float64
        else:
            acc_t = tl.float32
        if HAS_MASK:
            m = tl.load(mask_ptr + row * s_mask + cols, mask=inb, other=0)
            valid = inb & (m != 0)
        else:
            valid = inb
        # masked-out tokens may hold anything (NaN included): never load them
        lp = tl.load(logp_ptr + row * s_logp + cols, mask=valid, other=0.0).to(acc_t)
        old = tl.load(old_ptr + row * s_old + cols, mask=valid, other=0.0).to(acc_t)
        # the scalars travel as float64 bit patterns (a float argument would be float32, and a
        # tensor of them would cost a host-to-device copy per call)
        clip_lo = clip_lo_bits.to(tl.int64).to(tl.float64, bitcast=True).to(acc_t)
        clip_hi = clip_hi_bits.to(tl.int64).to(tl.float64, bitcast=True).to(acc_t)
        kl_coef = kl_coef_bits.to(tl.int64).to(tl.float64, bitcast=True).to(acc_t)
        A = tl.load(adv_ptr + row).to(acc_t)
        w = tl.load(roww_ptr + row).to(acc_t)
        zero = tl.zeros([BLOCK_T], dtype=acc_t)

        raw = lp - old
        if PPO:
            in_range = (raw >= -_LIMIT) & (raw <= _LIMIT)
            ratio = tl.exp(tl.minimum(tl.maximum(raw, -_LIMIT), _LIMIT))
            clipped_ratio = tl.minimum(tl.maximum(ratio, 1.0 - clip_lo), 1.0 + clip_hi)
            unclipped = -A * ratio
            clipped = -A * clipped_ratio
            loss = tl.maximum(unclipped, clipped)
            grad = tl.where((unclipped >= clipped) & in_range, unclipped, zero)
            n_clipped = tl.sum(tl.where(valid & (clipped > unclipped), 1.0, 0.0).to(acc_t), axis=0)
        else:
            loss = -A * lp
            grad = zero - A
            n_clipped = tl.sum(zero, axis=0)
        if HAS_REF:
            ref = tl.load(ref_ptr + row * s_ref + cols, mask=valid, other=0.0).to(acc_t)
            d_raw = ref - lp
            d = tl.minimum(tl.maximum(d_raw, -_LIMIT), _LIMIT)
            e = tl.exp(d)
            kl = e - d - 1.0
            k3 = tl.sum(tl.where(valid, kl, zero), axis=0)
            if USE_KL:
                loss = loss + kl_coef * kl
                d_in_range = (d_raw >= -_LIMIT) & (d_raw <= _LIMIT)
                grad = grad + tl.where(d_in_range, kl_coef * (1.0 - e), zero)
        else:
            k3 = tl.sum(zero, axis=0)
        loss_sum = tl.sum(tl.where(valid, loss * w, zero), axis=0)
        k1 = tl.sum(old - lp, axis=0)
        if WRITE_GRAD:
            g = tl.where(valid, grad * w, zero)
            tl.store(grad_ptr + row * s_grad + cols, g.to(grad_ptr.dtype.element_ty), mask=inb)
        base = part_ptr + (row * n_blocks + blk) * 4
        tl.store(base + 0, loss_sum)
        tl.store(base + 1, n_clipped)
        tl.store(base + 2, k1)
        tl.store(base + 3, k3)


BLOCK_T = 512  # tokens per program: a fixed block, so a new sequence length never recompiles
NUM_WARPS = 4


def launch_arguments(logp, old_c, ref_c, mask_c, adv, row_w, grad, partials, n_blocks, ppo,
                     clip_lo, clip_hi, kl_coef, write_grad):
    """(grid, positional arguments, keyword arguments) of the kernel launch."""
    B, T = logp.shape
    has_ref = ref_c is not None
    ref_arg = ref_c if has_ref else logp
    args = (logp, old_c, ref_arg, mask_c, adv, row_w, grad if write_grad else logp, partials,
            T, n_blocks, logp.stride(0), old_c.stride(0), ref_arg.stride(0), mask_c.stride(0),
            grad.stride(0) if write_grad else 0,
            float64_bits(clip_lo), float64_bits(clip_hi), float64_bits(kl_coef))
    kwargs = dict(PPO=bool(ppo), HAS_REF=has_ref, HAS_MASK=True,
                  USE_KL=bool(has_ref and kl_coef > 0), WRITE_GRAD=bool(write_grad),
                  FP64=adv.dtype == torch.float64, BLOCK_T=BLOCK_T, num_warps=NUM_WARPS)
    return (B, n_blocks), args, kwargs


def launch(logp, old_logp, ref_logp, valid, adv, row_w, ppo, clip_lo, clip_hi, kl_coef, write_grad):
    """Run the kernel; returns (loss sum, stat sums [3], grad or None) in the compute dtype."""
    B, T = logp.shape
    dtype = adv.dtype
    logp_c = logp.detach() if logp.stride(-1) == 1 else logp.detach().contiguous()
    old_c = old_logp if old_logp.stride(-1) == 1 else old_logp.contiguous()
    ref_c = None
    if ref_logp is not None:
        ref_c = ref_logp if ref_logp.stride(-1) == 1 else ref_logp.contiguous()
    mask_c = valid.contiguous()
    if mask_c.dtype == torch.bool:
        mask_c = mask_c.view(torch.uint8)
    n_blocks = triton.cdiv(max(T, 1), BLOCK_T)
    partials = torch.zeros(B * n_blocks * _NUM_PARTIALS, dtype=dtype, device=logp.device)
    grad = torch.empty((B, T), dtype=logp.dtype, device=logp.device) if write_grad else None
    if B > 0 and T > 0:
        grid, args, kwargs = launch_arguments(logp_c, old_c, ref_c, mask_c, adv.contiguous(),
                                              row_w.contiguous(), grad, partials, n_blocks, ppo,
                                              clip_lo, clip_hi, kl_coef, write_grad)
        with device_guard(logp):  # the tensors' device and its current stream
            _policy_loss_kernel[grid](*args, **kwargs)
    elif write_grad:
        grad.zero_()
    totals = partials.view(-1, _NUM_PARTIALS).sum(0)
    return totals[0], totals[1:], grad


class _TritonPolicyLoss(SavedGradientLoss):
    @staticmethod
    def forward(ctx, logp, old_logp, ref_logp, valid, adv, row_w, p):
        loss, sums, grad = launch(logp, old_logp, ref_logp, valid, adv, row_w, p.ppo, p.clip_lo, p.clip_hi,
                                  p.kl_coef, write_grad=ctx.needs_input_grad[0])
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(sums)
        return loss.to(logp.dtype), sums


def fused_triton_loss(logp, old_logp, ref_logp, valid, adv, row_w, p):
    """The Triton backend of ``bonkernels.loss.policy_loss`` (same interface as the others)."""
    return _TritonPolicyLoss.apply(logp, old_logp.detach(), None if ref_logp is None else ref_logp.detach(),
                                   valid, adv, row_w, p)
