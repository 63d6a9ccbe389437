"""Triton backend: the fused advantages op as one Triton kernel launch.

* Every estimator the kernel implements (``_facts.py`` reads them and their facts from the registry;
  all but ``maxk_offpolicy_exact``), including ``maxrl``; float16/bfloat16/float32/float64 rewards;
  groups of up to ``MAX_GROUP_SIZE`` (4096) samples. Arithmetic in float64 like the reference,
  output cast once.
* Mixtures over k (``k_weights``): the linear estimators read their mixed weight tables from a
  ``bank`` (``bank_index[n]`` = the block for groups of size n), at the cost of a single k.
* One launch per call, no host sync when ``max_group_size`` is given, under the values' device and
  on its current stream. Group sizes are bucketed to powers of two from 8 (``_config.py``):
  4 dtypes x 14 launch configurations (one per block; three for each block up to 16: a thread per
  group with and without the off-policy branch, and the spread layout) = 56 kernel
  specialisations, which ``python -m bonkernels.triton.aot`` compiles ahead of time for
  sm_80/sm_90.
* Blocks up to 16 run a thread per group (its sort, scans and reductions in that thread's
  registers; the sort is Batcher's odd-even merge network, which compares each pair of rewards
  once and moves their columns alongside) on batches of at least ``_config.LANE_MIN_GROUPS``
  groups; smaller batches and larger blocks spread a group over threads and sort packed (key,
  column) words with ``tl.sort`` (two passes for float64). On a GPU every launch runs the same
  kernel compiled with its estimator's facts as constants (``_sources.py``; compiled on first use
  and kept), which frees the registers the other estimators' tiles would hold: the spread layout
  then fits without a spill up to block 1024, and on-policy launches keep a thread per group up to
  block 32 for 16- and 32-bit rewards (64 for grpo, rloo, dr_grpo and maxrl); ``--estimators`` of
  the aot module compiles one per estimator.
* A plan (``bk.prepare_advantages``) binds everything but the tensors once and, from its second
  call on a GPU, launches the compiled kernel directly (``advantages.PreparedLaunch``).
* Without input checks the kernel stays inside its tensors: offsets are clamped, a group with a
  NaN/inf reward (or delta) or larger than the launch's block gets NaN for every sample, and each
  sample is stored at its own index.
* Registered as ``torch.ops.bonkernels.triton_advantages`` (``torch.library.triton_op``) for
  torch.compile; eager calls launch directly.

Importing this package does not import triton; the kernels load on first use. On CPU tensors the
kernels run only under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported).
"""

from __future__ import annotations

import importlib.util
import os

from ._config import MAX_BLOCK as MAX_GROUP_SIZE  # larger groups: use another backend


def available() -> bool:
    """True when triton is installed (the kernels still need CUDA tensors or the interpreter)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1: the kernels then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def advantages_packed(values, offsets, deltas, k, estimator_code, clamp_delta, clip_lo, clip_hi,
                      mean_scale, small_groups, eps, max_group_size=None, *, bank=None,
                      bank_index=None):
    """The backend interface (see bonkernels.reference.advantages_packed), as one Triton launch."""
    if not available():
        raise ImportError("backend='triton' needs the triton package (pip install triton)")
    from .advantages import advantages_packed as launch

    return launch(values, offsets, deltas, k, estimator_code, clamp_delta, clip_lo, clip_hi,
                  mean_scale, small_groups, eps, max_group_size, bank=bank, bank_index=bank_index)
