"""The contracts of ``docs/internals-contracts.md`` that are about where a thing is known: restore
key shapes only in ``energon.pipeline.keys``, the snapshot layout only in
``energon.pipeline.snapshot``, state fields read through ``energon.state_fields``; and the page's
table of which test checks which contract names tests that exist.

Each detector is shown to see what it looks for, so that a test here cannot pass by seeing
nothing.
"""

from __future__ import annotations

import ast
import re

import pytest

from energon.pipeline import keys
from tests.helpers.modules import module_files
from tests.helpers.paths import REPO_ROOT

#: the tags of the key shapes in energon.pipeline.keys's table (pointers carry their leaf kind)
KEY_TAGS = {
    keys.MAP,
    keys.PACK,
    keys.PIECE,
    keys.BATCH,
    keys.STREAM,
    "BlendDataset",
    "ConcatDataset",
}

#: restore methods that read their state by subscripts, each with its reason
UNCHECKED_READS_ALLOWED = {
    "energon.pipeline.error_account": "reads the account inside one try that turns any bad "
    "field into a StateError (a stream's 'errors' account is damaged: ...)",
    "energon.loader.position": "takes the position of a loader state that "
    "energon.state.check_state_shape has checked field by field before",
}


def key_shapes(source: str) -> list[int]:
    """Lines that build a tagged key tuple (3 or more entries, a tag first) or compare to a tag."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple) and len(node.elts) >= 3 and _is_tag(node.elts[0]):
            found.append(node.lineno)
        if isinstance(node, ast.Compare) and any(
            _is_tag(n) for n in [node.left, *node.comparators]
        ):
            found.append(node.lineno)
    return found


def _is_tag(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in KEY_TAGS


def unchecked_state_reads(source: str) -> list[int]:
    """Lines where a ``restore(self, state, ...)`` method subscripts its state (``state["x"]``)
    instead of reading the field through ``energon.state_fields``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.FunctionDef) and node.name == "restore"):
            continue
        if len(node.args.args) < 2:
            continue
        state = node.args.args[1].arg
        found += [
            sub.lineno
            for sub in ast.walk(node)
            if isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == state
        ]
    return sorted(found)


def snapshot_fields(source: str) -> list[int]:
    """Lines with the snapshot's own field name ``"stages"`` as a literal."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value == "stages"
    ]


def test_the_detectors_see_what_they_look_for():
    assert key_shapes(
        'k = ("Map", h, i, 0, key, None)\nif k[0] == "Batch": pass\nx = ("Map", 1)'
    ) == [1, 2]
    method = "class S:\n    def restore(self, state):\n        self.n = int(state['n'])\n"
    assert unchecked_state_reads(method) == [3]
    assert unchecked_state_reads(method.replace("int(state['n'])", "get(state, 'n', 'w')")) == []
    assert snapshot_fields('n = snap["stages"]\n') == [1]


def _offenders(detector, owner: str | None = None) -> dict[str, list[int]]:
    return {
        module: lines
        for module, path in module_files().items()
        if module != owner and (lines := detector(path.read_text()))
    }


def test_only_the_keys_module_knows_key_shapes():
    """Every tagged key is built and taken apart by ``energon.pipeline.keys`` (the compat
    wrappers' blend and concat keys too)."""
    assert _offenders(key_shapes, "energon.pipeline.keys") == {}


def test_only_the_snapshot_module_knows_the_snapshot_layout():
    assert _offenders(snapshot_fields, "energon.pipeline.snapshot") == {}


def test_restore_methods_read_state_fields_through_state_fields():
    """A damaged field is then a StateError naming it, not a hang or a different order (the
    compat wrappers' stages and ExcludeFilter once read theirs unchecked)."""
    found = _offenders(unchecked_state_reads)
    assert sorted(set(found) - set(UNCHECKED_READS_ALLOWED)) == []
    assert sorted(set(UNCHECKED_READS_ALLOWED) - set(found)) == []  # stale entries go


CONTRACTS = REPO_ROOT / "docs" / "internals-contracts.md"


def table_tests(text: str) -> list[tuple[str, str]]:
    """``(file, test)`` of every ``tests/...py::test_name`` the page names."""
    return re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", text)


def test_the_contract_table_names_tests_that_exist():
    named = table_tests(CONTRACTS.read_text())
    assert len(named) >= 20  # the table is there and read
    missing = []
    for path, test in named:
        file = REPO_ROOT / path
        if not file.exists() or not re.search(rf"^def {test}\(", file.read_text(), re.M):
            missing.append(f"{path}::{test}")
    assert missing == []


@pytest.mark.parametrize("text", ["`tests/x/test_gone.py::test_gone`"])
def test_the_table_check_reads_test_names(text):
    assert table_tests(text) == [("tests/x/test_gone.py", "test_gone")]
