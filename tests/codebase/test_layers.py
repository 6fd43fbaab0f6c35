"""Folders are layers: the order is the list in docs/internals-contracts.md (section "Layers"),
and no module imports from a unit of a higher layer (imports inside functions count), so the
top-level units form no cycle."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.modules import (
    import_cycles,
    import_graph,
    moved_modules,
    run_fresh,
    unit_graph,
    unit_of,
)
from tests.helpers.paths import REPO_ROOT

CONTRACTS = REPO_ROOT / "docs" / "internals-contracts.md"


def read_layers(text: str) -> list[list[str]]:
    """The units of each layer, bottom first: the numbered items of the "Layers" section, each
    starting with its units in bold (``1. **errors, state_fields**: ...``)."""
    section = text.split("### Layers", 1)[1].split("\n### ", 1)[0]
    return [
        [unit.strip() for unit in match.split(",")]
        for match in re.findall(r"^\d+\. \*\*([^*]+)\*\*", section, flags=re.MULTILINE)
    ]


def read_allowed(text: str) -> set[tuple[str, str]]:
    """The imports that run up on purpose: ``- `energon.a` -> `energon.b`: why`` items of the
    "Layers" section."""
    section = text.split("### Layers", 1)[1].split("\n### ", 1)[0]
    return set(re.findall(r"^- `(energon[\w.]*)` -> `(energon[\w.]*)`", section, re.MULTILINE))


def upward_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module from a unit of a higher layer."""
    rank = {unit: level for level, units in enumerate(layers) for unit in units}
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if unit_of(module) and unit_of(target) and rank[unit_of(target)] > rank[unit_of(module)]
    }


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_layer_list_names_every_unit_once(graph):
    layers = read_layers(CONTRACTS.read_text())
    listed = [unit for units in layers for unit in units]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(unit_graph(graph))


def test_no_module_imports_from_a_higher_layer(graph):
    text = CONTRACTS.read_text()
    upward = upward_imports(graph, read_layers(text))
    allowed = read_allowed(text)
    assert sorted(upward - allowed) == []
    assert sorted(allowed - upward) == []  # stale entries go


def test_no_cycle_between_units(graph):
    assert import_cycles(unit_graph(graph)) == []


def test_upward_imports_are_found_inside_functions(tmp_path):
    package = tmp_path / "pkg"
    for name, text in {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from pkg.high import b\n",
        "high/__init__.py": "",
        "high/b.py": "from pkg.low import a\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = import_graph(package)
    assert upward_imports(graph, [["low"], ["high"]]) == {("pkg.low.a", "pkg.high.b")}
    assert import_cycles(unit_graph(graph)) == [["high", "low"]]


_OLD_PATHS = """
import importlib, json
import energon
print(json.dumps({
    old: importlib.import_module(old) is importlib.import_module(new)
    for old, new in energon._MOVED.items()
}))
"""


def test_moved_modules_keep_their_old_import_paths():
    """A module that moved to its layer is the same module object under its old path."""
    proc = run_fresh(_OLD_PATHS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == dict.fromkeys(moved_modules(), True)
