"""Which dispatched ops would synchronise a GPU with the host: a recorder for the sync-free tests.

An op "syncs" when it reads a device tensor's data on the host (``.item()``, ``int()``,
``bool()`` of a tensor: ``_local_scalar_dense``) or when its output size depends on the data
(``nonzero``, boolean-mask indexing, ``unique``, ``repeat_interleave`` without an output size).
Used by test_api_contract.py (``bk.advantages``) and test_sync_free.py (``bk.policy_loss``).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::nonzero_static",
           "aten::masked_select", "aten::equal", "aten::unique_consecutive", "aten::_unique2", "aten::unique_dim",
           "aten::_unique", "aten::lift_fresh", "aten::lift_fresh_copy", "aten::allclose"}


class Recorder(TorchDispatchMode):
    """Records every aten (and custom) op a call dispatches, with its arguments."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, args))
        return func(*args, **(kwargs or {}))

    def syncs(self):
        return syncs(self.ops)


def syncs(ops):
    """The names of the recorded ops that would sync on a GPU."""
    bad = []
    for func, args in ops:
        name = func._schema.name
        flat = [a for a in args if isinstance(a, (list, tuple))]
        bool_index = any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for lst in flat for t in lst)
        if name in SYNCING or (name in ("aten::index", "aten::index_put", "aten::index_put_") and bool_index) \
                or (name == "aten::repeat_interleave" and "output_size" not in str(args)):
            bad.append(name)
    return bad
