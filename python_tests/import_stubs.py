"""Import-only stand-ins for the GPU-only packages that OpenRLHF's modules import at top level.

OpenRLHF's experience-maker module imports ``flash_attn`` (a CUDA build), ``vllm`` (a GPU inference
engine, over 500 MB) and ``deepspeed`` at import time; the code under test (advantage and return
computation, argument parsing) never calls them. Where one is not installed, :func:`stub_modules`
registers an empty module for it (any attribute is a dummy class or function) so the real
OpenRLHF code can be imported and run on a CPU-only machine. Installed packages are never replaced.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

GPU_ONLY = ("flash_attn", "vllm", "deepspeed")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__bonkernels_stub__ = True

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {}) if name[:1].isupper() else (lambda *args, **kwargs: None)

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


class _StubFinder(importlib.abc.MetaPathFinder):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


@contextlib.contextmanager
def stubbed(roots=GPU_ONLY):
    """Within the block, each root package that is not installed imports as a stub.

    Afterwards the stubs leave ``sys.modules`` and the import system again (modules imported in
    the block keep their references), so later tests, e.g. TRL's "is vllm installed?" checks, see
    the machine as it is. Yields the names stubbed.
    """
    missing = [r for r in roots if r not in sys.modules and importlib.util.find_spec(r) is None]
    finder = _StubFinder(missing)
    sys.meta_path.append(finder)   # after the real finders: a real package always wins
    try:
        yield missing
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in finder.roots]:
            if getattr(sys.modules[name], "__bonkernels_stub__", False):
                del sys.modules[name]
