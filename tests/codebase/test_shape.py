"""No hubs: in ``energon/`` no function is over 80 lines, no class over 400, no file over 800.

A unit that grows past these limits does too many things for a newcomer to read in one sitting:
split it by responsibility (docs/internals.md, "Shape"). Sizes are lines from the ``def`` or
``class`` line to the last line of the body (docstrings and comments count, decorators do not),
as ``ast`` gives them. A unit still over its limit while it is being split is listed in
``EXCEPTIONS`` with the reason; the test fails on any other unit over a limit, and on an entry
that is now within its limit (so the list cannot outlive the work that removes it).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.modules import PACKAGE_DIR

MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 400
MAX_FILE_LINES = 800

# "energon/x.py" (a file) or "energon/x.py:Name" (a class or function; nested: "Outer.inner")
# -> why it is still over its limit. Empty: every unit of energon/ is within the limits.
EXCEPTIONS: dict[str, str] = {}


def oversized(source: str, path: str) -> dict[str, int]:
    """Every unit of one file over its limit -> its length in lines."""
    found = {}
    lines = len(source.splitlines())
    if lines > MAX_FILE_LINES:
        found[path] = lines

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                length = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                if length > limit:
                    found[f"{path}:{name}"] = length
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def oversized_units(package_dir: Path = PACKAGE_DIR) -> dict[str, int]:
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent).as_posix()
        found.update(oversized(path.read_text(), relative))
    return found


def test_the_measure_sees_long_functions_classes_and_files():
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = (
        f"def short():\n    return 1\n\n\ndef long():\n{long_body}\n\n"
        f"class Box:\n    def method(self):\n{long_body.replace('    ', '        ')}"
        "\n    if True:\n        def hidden():\n" + long_body.replace("    ", "            ")
    )
    found = oversized(source, "energon/m.py")
    assert found == {
        "energon/m.py:long": MAX_FUNCTION_LINES + 1,
        "energon/m.py:Box.method": MAX_FUNCTION_LINES + 1,
        "energon/m.py:Box.hidden": MAX_FUNCTION_LINES + 1,
    }
    big_class = "class Big:\n" + "".join(f"    y{i} = {i}\n" for i in range(MAX_CLASS_LINES))
    assert oversized(big_class, "energon/b.py") == {"energon/b.py:Big": MAX_CLASS_LINES + 1}
    filler = "z = 0\n" * (MAX_FILE_LINES + 1)
    assert oversized(filler, "energon/f.py") == {"energon/f.py": MAX_FILE_LINES + 1}
    assert oversized(filler[: -len("z = 0\n")], "energon/f.py") == {}


def test_no_unit_of_energon_is_over_its_limit():
    found = oversized_units()
    unlisted = {unit: lines for unit, lines in found.items() if unit not in EXCEPTIONS}
    assert unlisted == {}, (
        f"over the limits (function {MAX_FUNCTION_LINES}, class {MAX_CLASS_LINES}, file "
        f"{MAX_FILE_LINES} lines): split by responsibility"
    )


def test_every_exception_is_still_over_its_limit():
    found = oversized_units()
    stale = sorted(unit for unit in EXCEPTIONS if unit not in found)
    assert stale == [], "within the limits now: remove these entries from EXCEPTIONS"
