"""Files are replaced in one place (``energon/atomic.py``: a temporary file in the target's
folder, renamed over it, removed if writing fails), so a reader never sees half a file. The
modules below rename on their own for the reason given; any other module that calls
``os.replace`` / ``os.rename`` fails this test, and so does an entry that no longer does."""

from __future__ import annotations

import ast

from tests.helpers.modules import module_files

OWN_RENAMES = {
    "energon.atomic": "the one home of atomic writes",
    "energon.native": "the compiler writes the library into a private temporary folder",
    "energon.format.tar_index": "prepare stages tar indices (write_tar_index_temp) and renames them",
    "energon.remote.cache": "cached objects stay private to their user (mkstemp's 0600)",
    "energon.prepare.dataset": "swaps whole folders; publishes an index built elsewhere (--tmp-path)",
    "energon.prepare.work": "publishes a finished chunk's files by hard link",
    "energon.prepare.media": "builds the media database in place under a temporary name",
    "energon.prepare.scan": "publishes a chunk's folder whole",
    "energon.prepare.cluster": "publishes a chunk's folder whole (made on another node)",
}


def renames(source: str) -> list[int]:
    """Line numbers of ``os.replace(...)`` / ``os.rename(...)`` calls."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("replace", "rename")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "os"
    ]


def test_the_detector_sees_renames():
    assert renames("import os\nos.replace(a, b)\nx.replace('a', 'b')\nos.rename(a, b)\n") == [2, 4]


def test_only_the_listed_modules_rename_files_themselves():
    found = {module for module, path in module_files().items() if renames(path.read_text())}
    assert sorted(found - set(OWN_RENAMES)) == []
    assert sorted(set(OWN_RENAMES) - found) == []  # stale entries go
