"""The Triton policy-loss kernel against the autograd reference.

Without a GPU the kernel runs under the Triton interpreter, which must be switched on before
triton is imported: the checks run in a subprocess with TRITON_INTERPRET=1. With CUDA, the same
checks also run directly on the GPU.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]

CHECKS = textwrap.dedent(r"""
    import sys
    import torch
    from bonkernels.loss import policy_loss

    device = sys.argv[1]

    def batch(B, T, dtype, seed, empty_rows=()):
        g = torch.Generator().manual_seed(seed)
        logp = (-1.0 + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64))
        old = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
        ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
        mask = torch.rand(B, T, generator=g) > 0.3
        mask[:, 0] = True
        for r in empty_rows:
            mask[r] = False
        old[0, 0] = logp[0, 0] - 30.0      # a token log-ratio beyond the clamp at 20
        ref[1, 0] = logp[1, 0] + 30.0      # and a KL term beyond it
        old[~mask] = float("nan")          # must never be read
        rewards = torch.rand(B, generator=g, dtype=torch.float64)
        to = lambda t: t.to(device=device, dtype=dtype)
        return to(logp), to(old), to(ref), mask.to(device), rewards.to(device)

    offsets = torch.tensor([0, 3, 3, 8, 10, 14], device=device)
    configs = [
        dict(estimator="maxk_loo1", k=2, weighting="ppo", loss_agg="token_mean"),
        dict(estimator="maxk_loo1", k=2, weighting="ppo", loss_agg="seq_mean_token_mean",
             ref=True, kl_coef=0.05, clip_eps=(0.1, 0.3)),
        dict(estimator="grpo", k=1, weighting="ppo", loss_agg="seq_mean_token_sum"),
        dict(estimator="maxk_offpolicy", k=2, weighting="direct", loss_agg="token_mean", clamp_delta=0.5),
        dict(estimator="maxk", k=2, weighting="direct", loss_agg="seq_mean_token_mean", ref=True, kl_coef=0.1),
    ]
    worst = {}
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        for T in (1, 11, 70):
            for i, cfg in enumerate(configs):
                cfg = dict(cfg)
                use_ref = cfg.pop("ref", False)
                est, k = cfg.pop("estimator"), cfg.pop("k")
                logp, old, ref, mask, rewards = batch(14, T, dtype, seed=i + T, empty_rows=(4,))
                out = {}
                for backend in ("torch", "triton"):
                    x = logp.clone().requires_grad_()
                    loss, stats = policy_loss(x, old, rewards, k, est, mask=mask, offsets=offsets,
                                              ref_logp=ref if use_ref else None, backend=backend, **cfg)
                    loss.backward()
                    out[backend] = (loss.detach(), x.grad, stats)
                (l0, g0, s0), (l1, g1, s1) = out["torch"], out["triton"]
                assert g1.dtype == dtype and l1.dtype == dtype
                assert torch.isfinite(g1).all(), (T, i)
                torch.testing.assert_close(l1, l0, rtol=tol, atol=tol)
                torch.testing.assert_close(g1, g0, rtol=tol, atol=tol * 1e-2)
                for key in s0:
                    torch.testing.assert_close(s1[key], s0[key], rtol=tol, atol=tol)
                assert (g1[~mask] == 0).all()
    # backward with grad_output != 1 scales the stored gradient
    logp, old, ref, mask, rewards = batch(8, 9, torch.float64, seed=99)
    x = logp.clone().requires_grad_()
    loss, _ = policy_loss(x, old, rewards, 2, mask=mask, group_size=4, backend="triton")
    (2.5 * loss).backward()
    y = logp.clone().requires_grad_()
    loss, _ = policy_loss(y, old, rewards, 2, mask=mask, group_size=4, backend="torch")
    loss.backward()
    torch.testing.assert_close(x.grad, 2.5 * y.grad, rtol=1e-12, atol=1e-14)
    print("TRITON_POLICY_LOSS_OK")
""")


def _run(device: str, interpret: bool):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", CHECKS, device], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "TRITON_POLICY_LOSS_OK" in proc.stdout, proc.stdout + proc.stderr


def test_triton_kernel_under_interpreter():
    _run("cpu", interpret=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernel_on_gpu():
    _run("cuda", interpret=False)


def test_triton_backend_without_cuda_or_interpreter_is_a_clear_error():
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the Triton path can run here")
    from bonkernels.loss import policy_loss
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        policy_loss(x, x, torch.rand(4), 2, group_size=4, backend="triton")


AOT_COMPILE = textwrap.dedent(r"""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from bonkernels.triton.policy_loss import BLOCK_T, _policy_loss_kernel

    I64 = ("s_logp", "s_old", "s_ref", "s_mask", "s_grad", "clip_lo_bits", "clip_hi_bits",
           "kl_coef_bits")
    for logp_t, acc_t, fp64 in (("*bf16", "*fp32", False), ("*fp32", "*fp32", False), ("*fp64", "*fp64", True)):
        for ppo in (True, False):
            consts = dict(PPO=ppo, HAS_REF=True, HAS_MASK=True, USE_KL=True, WRITE_GRAD=True, FP64=fp64,
                          BLOCK_T=BLOCK_T)
            sig = {n: (acc_t if n.endswith("_ptr") else "i64" if n in I64 else "i32")
                   for n in _policy_loss_kernel.arg_names if n not in consts}
            sig.update(logp_ptr=logp_t, old_ptr=logp_t, ref_ptr=logp_t, grad_ptr=logp_t, mask_ptr="*u8")
            sig.update({c: "constexpr" for c in consts})
            k = triton.compile(ASTSource(fn=_policy_loss_kernel, signature=sig, constexprs=consts),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            assert "ld.global" in k.asm["ptx"]
    print("AOT_OK")
""")


def test_one_compilation_per_dtype_and_flags():
    """Sequence length, strides and pointer alignment do not change the kernel's specialisation
    (each change used to compile a new kernel): Triton's own argument binder, for an sm_90 target,
    sees the same signature, constexprs and attributes whatever T and the strides are."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as error:  # a private API of triton 3.x
        pytest.skip(f"triton internals moved: {error}")
    from bonkernels.triton import policy_loss as pl

    backend = make_backend(GPUTarget("cuda", 90, 32))
    kernel = pl._policy_loss_kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    for dtype in (torch.float32, torch.float64):
        keys = set()
        for T, width, shift in ((1, 1, 0), (11, 16, 1), (16, 16, 0), (70, 77, 3), (513, 520, 0),
                                (5000, 5000, 5)):
            storage = torch.zeros(3 * width + shift + T, dtype=dtype)
            logp = storage[shift:shift + 3 * width].view(3, width)[:, :T]
            mask = torch.ones(3, T, dtype=torch.uint8)
            adv = torch.zeros(3, dtype=dtype)
            n_blocks = triton.cdiv(T, pl.BLOCK_T)
            partials = torch.zeros(3 * n_blocks * 4, dtype=dtype)
            grid, args, kwargs = pl.launch_arguments(logp, logp, logp, mask, adv, adv,
                                                     torch.empty(3, T, dtype=dtype), partials,
                                                     n_blocks, True, 0.2, 0.3, 0.1, True)
            bound, specialization, options = binder(*args, **kwargs)
            _, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound,
                                                               specialization, options)
            assert all(not a for a in attrs.values()), (T, attrs)
            keys.add((tuple(sorted(signature.items())), tuple(sorted(constexprs.items()))))
        assert len(keys) == 1, keys


def test_triton_kernel_compiles_for_sm90():
    """Ahead-of-time compile for Hopper (no GPU needed): catches what the interpreter accepts but
    the compiler would not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", AOT_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ptxas" in (proc.stderr or "").lower() and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas available for ahead-of-time compilation")
    assert proc.returncode == 0 and "AOT_OK" in proc.stdout, proc.stdout + proc.stderr
