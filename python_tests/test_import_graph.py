"""No import cycle anywhere in the package, and every module imports on its own.

The graph is built statically from every ``import`` / ``from ... import`` of a bonkernels module,
at module level and inside functions alike (a late import hides a cycle; it does not remove it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bonkernels"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_extension(package_init: Path, name: str) -> bool:
    return package_init.name == "__init__.py" and (name == "_C" or any(package_init.parent.glob(f"{name}.*.so")))


def import_graph() -> dict:
    """module -> set of bonkernels modules it imports (including submodules named in from-imports)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                if base in modules and any(_is_extension(modules[base], a.name) for a in node.names):
                    continue                                  # the compiled extension (_C)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:     # bonkernels.x.y where y is a name
                    target = target.rpartition(".")[0]
                if target.startswith("bonkernels") and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict):
    """One cycle as a list of modules, or None (iterative DFS, colours white/grey/black)."""
    colour = {m: 0 for m in graph}
    for start in graph:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
                continue
            if child not in colour:
                continue
            if colour[child] == 1:
                return path[path.index(child):] + [child]
            if colour[child] == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_graph_finds_a_cycle_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    graph = import_graph()
    assert "bonkernels.ops" in graph["bonkernels"]           # the scan sees the package's imports


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


_IMPORT_EACH_ALONE = """
import importlib, sys, traceback
failures = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "bonkernels" or m.startswith("bonkernels.")]:
        del sys.modules[loaded]          # a fresh bonkernels for each module (torch stays loaded)
    try:
        importlib.import_module(name)
    except Exception as error:
        failures.append(f"{name}: {type(error).__name__}: {error}")
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


def test_every_module_imports_alone():
    names = [m for m in _modules() if not m.endswith("__main__")]
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH_ALONE, *names], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
