"""How many registers the Triton lane kernels would need if they were compiled for one estimator.

    python -m bench.triton_specialise_probe [estimator ...]     # default: maxk_loo1 grpo maxk_offpolicy

The shipped kernel takes the estimator, its facts and the bank mode as runtime arguments, so one
compiled kernel serves them all and holds the registers of the largest. This probe compiles the
same source for sm_90 (no GPU needed) with some of those arguments fixed as compile-time constants,
the way a kernel specialised per estimator would be, and reports registers and spills (ptxas -v)
and PTX lines: a static estimate of what such a specialisation would buy (warps per SM), to be
timed on a GPU before it is built.
"""

from __future__ import annotations

import argparse

from bonkernels import estimators
from bonkernels.triton import _config, _facts
from bonkernels.triton.aot import _signature, resource_usage


def compile_fixed(config: _config.LaunchConfig, fixed: dict, dtype_name: str = "fp32") -> tuple[str, int]:
    """(ptxas resource line, PTX lines) of the kernel with the `fixed` arguments as constants."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bonkernels.triton._advantages_kernel import advantages_kernel

    signature = _signature(dtype_name)
    signature.update({name: "constexpr" for name in fixed})
    source = ASTSource(fn=advantages_kernel, signature=signature, constexprs={**config.constexprs(), **fixed})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": config.num_warps})
    ptx = compiled.asm["ptx"]
    return resource_usage(ptx, 90).lstrip(", "), ptx.count("\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("estimators", nargs="*", default=["maxk_loo1", "grpo", "maxk_offpolicy"])
    ap.add_argument("--block", type=int, default=16)
    args = ap.parse_args(argv)
    print("| estimator | block | fixed as constants | registers, spills | PTX lines |")
    print("|---|---|---|---|---|")
    for name in args.estimators:
        est = estimators.get(name)
        config = _config.config_for_block(args.block, est.needs_deltas, True)
        facts = {"code": est.code, "sorts": int(not est.order_free)}
        if _facts.linear_in_tables(est) and est.uses_k:
            facts["has_bank"] = 1  # a [G, n] call of one k reads the cached bank
        for label, fixed in (("none (the shipped kernel)", {}), ("code", {"code": est.code}),
                             (", ".join(facts), facts)):
            resources, lines = compile_fixed(config, fixed)
            print(f"| {name} | {args.block} | {label} | {resources} | {lines:,} |", flush=True)


if __name__ == "__main__":
    main()
