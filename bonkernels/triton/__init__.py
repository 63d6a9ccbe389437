"""Triton backend: the fused advantages op as one Triton kernel launch.

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
                      mean_scale, small_groups, eps, max_group_size):
    """The backend interface (see bonkernels.reference.advantages_packed), as one Triton launch."""
    if not available():
        raise ImportError("backend='triton' needs the triton package (pip install triton)")
    from .advantages import advantages_packed as launch

    return launch(values, offsets, deltas, k, estimator_code, clamp_delta, clip_lo, clip_hi,
                  mean_scale, small_groups, eps, max_group_size)
