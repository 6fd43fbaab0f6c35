"""``tools/`` holds scripts by role, and tests never import them: a test runs a tool as a program,
and whatever tests share lives in ``tests/helpers``."""

from __future__ import annotations

import ast

from tests.helpers.paths import REPO_ROOT, TOOLS

TOOL_FOLDERS = {"benchmarks", "examples", "docs", "compat", "device"}
# Calls that widen the import path or load code by file path.
_SYS_PATH_EDITS = {"insert", "append", "extend"}
_LOAD_BY_PATH = {"spec_from_file_location", "run_path", "SourceFileLoader"}


def test_tools_are_sorted_by_role():
    entries = {p.name for p in TOOLS.iterdir() if not p.name.startswith((".", "__"))}
    assert entries == TOOL_FOLDERS
    assert all((TOOLS / folder).is_dir() for folder in entries)


def path_imports(source: str, tool_modules: set[str]) -> list[int]:
    """Lines that import a tool module, or load code by path / change ``sys.path``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots = {(node.module or "").split(".")[0]}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            is_sys_path = isinstance(owner, ast.Attribute) and owner.attr == "path"
            if name in _LOAD_BY_PATH or (name in _SYS_PATH_EDITS and is_sys_path):
                lines.append(node.lineno)
            continue
        else:
            continue
        if roots & (tool_modules | {"tools"}):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_detector_sees_path_imports():
    source = (
        "import sys\nsys.path.insert(0, 'tools/benchmarks')\nimport bench_common\n"
        "from tools.docs import gen_internals\nitems = []\nitems.append(1)\n"
    )
    assert path_imports(source, {"bench_common"}) == [2, 3, 4]


def test_no_test_imports_a_tool():
    tool_modules = {p.stem for p in TOOLS.rglob("*.py")}
    offenders = {
        str(path.relative_to(REPO_ROOT)): lines
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        if (lines := path_imports(path.read_text(), tool_modules))
    }
    assert offenders == {}
