"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def lanes_at_every_batch_size():
    """The Triton kernel runs a thread per group (blocks up to 16) only on batches of
    LANE_MIN_GROUPS groups or more, far more than a test under the interpreter can afford: this
    lowers the threshold to one group, so small batches test those kernels. (The spread layout
    that small batches take at those blocks is tested on its own.)"""
    from bonkernels.triton import _config  # pure Python: imports no triton

    with _config.lane_threshold(1):
        yield
