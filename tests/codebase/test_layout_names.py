"""The ``.nv-meta`` folder and its files are named in one place (``energon/format/layout.py``): code builds its
paths from layout's names, so the on-disk layout cannot drift between readers and writers."""

from __future__ import annotations

import ast
from collections.abc import Callable

from energon.format import layout
from energon.format.layout import MAIN_FOLDER_NAME
from tests.helpers.modules import module_files


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def _literal_lines(text: str, matches: Callable[[str], bool]) -> list[int]:
    """Line numbers of string literals (docstrings aside) whose value ``matches``."""
    tree = ast.parse(text)
    docs = _docstrings(tree)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and matches(node.value)
    )


def literal_uses(text: str, needle: str) -> list[int]:
    """Line numbers of string literals (docstrings aside) that contain ``needle``."""
    return _literal_lines(text, lambda value: needle in value)


def test_the_detector_sees_literals_but_not_docstrings():
    source = '"""Writes .nv-meta/x."""\nPATH = root + "/.nv-meta/x"\nf"{root}/.nv-meta"\n'
    assert literal_uses(source, MAIN_FOLDER_NAME) == [2, 3]


def test_no_module_spells_the_metadata_folder_itself():
    offenders = {
        module: lines
        for module, path in module_files().items()
        if module != "energon.format.layout"
        and (lines := literal_uses(path.read_text(), MAIN_FOLDER_NAME))
    }
    assert offenders == {}


FILE_NAMES = sorted(value for name, value in vars(layout).items() if name.endswith("_FILENAME"))


def file_name_uses(text: str) -> list[int]:
    """Line numbers of string literals (docstrings aside) that are one of the ``.nv-meta`` file
    names or a path ending in one."""
    return _literal_lines(
        text, lambda value: any(value == n or value.endswith("/" + n) for n in FILE_NAMES)
    )


def test_the_file_name_detector_sees_names_and_paths():
    assert "split.yaml" in FILE_NAMES and ".info.json" in FILE_NAMES
    source = 'a = "split.yaml"\nb = f"{root}/.info.json"\nc = "no split.yaml here"\n'
    assert file_name_uses(source) == [1, 2]


def test_no_module_spells_a_metadata_file_name_itself():
    """Defaults, CLI options and the reference's constants take the names from layout."""
    offenders = {
        module: lines
        for module, path in module_files().items()
        if module != "energon.format.layout" and (lines := file_name_uses(path.read_text()))
    }
    assert offenders == {}
