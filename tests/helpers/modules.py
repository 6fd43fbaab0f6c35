"""energon's modules as files and as an import graph, for the tests of the code's shape.

The graph is read from the source (``ast``), so it sees every import: at module level, inside
functions and under ``if TYPE_CHECKING``. An import of ``energon.a.b`` (or ``from energon.a import
b``) is an edge to the module ``energon.a.b`` when it exists, else to the package ``energon.a``.
``from energon import name`` counts an edge to the module that ``energon/__init__.py`` lazily takes
``name`` from (its ``_EXPORTS`` map), since that import runs the module; an import of a module's
old path (``_MOVED``) an edge to the module at its new path.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO_ROOT

PACKAGE_DIR = REPO_ROOT / "energon"


def module_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (packages included)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _root_map(package_dir: Path, name: str) -> dict[str, str]:
    """A dict literal of ``energon/__init__.py`` (``_EXPORTS``, ``_MOVED``)."""
    tree = ast.parse((package_dir / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return {}


def _lazy_exports(package_dir: Path) -> dict[str, str]:
    """``energon/__init__.py``'s ``_EXPORTS``: public name -> module it is imported from."""
    return _root_map(package_dir, "_EXPORTS")


def moved_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """``energon/__init__.py``'s ``_MOVED``: old import path -> the module's path now."""
    return _root_map(package_dir, "_MOVED")


def _imported_names(module: str, is_package: bool, node: ast.AST) -> list[str]:
    """Dotted names an import statement makes Python import (``from a import b``: ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" for alias in node.names]


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its source)."""
    package = package_dir.name
    files = module_files(package_dir)
    exports = _lazy_exports(package_dir)
    moved = moved_modules(package_dir)

    def target(name: str) -> str | None:
        head, _, attr = name.rpartition(".")
        if head == package and name not in files:
            return exports.get(attr)  # ``from energon import X``: the module X lives in
        for old, new in moved.items():  # an old path: the module it names now
            if name == old or name.startswith(old + "."):
                name = new + name[len(old) :]
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name if name and name != package else None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported_names(module, is_package, node):
                if name == package or name.startswith(package + "."):
                    found = target(name)
                    if found is not None and found != module:
                        edges.add(found)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def run_fresh(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` in a new interpreter that imports energon from this checkout."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=env,
    )


def unit_of(module: str) -> str:
    """The top-level unit a module belongs to: ``energon.pipeline.stages`` -> ``pipeline``,
    ``energon.errors`` -> ``errors`` (the package root itself is ``""``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into top-level units (the package root left out: it only
    re-exports, lazily)."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        unit = unit_of(module)
        if not unit:
            continue
        edges = units.setdefault(unit, set())
        edges.update(t for t in map(unit_of, targets) if t and t != unit)
    return units
