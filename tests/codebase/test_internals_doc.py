"""docs/internals.md matches the code: it is what tools/docs/gen_internals.py generates from the
modules' docstrings (plus docs/internals-contracts.md), and every module path and dotted name it
mentions exists."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers.modules import run_fresh
from tests.helpers.paths import REPO_ROOT, TOOLS

DOC = REPO_ROOT / "docs" / "internals.md"

_RESOLVE = """
import importlib, json, sys
missing = []
for name in sys.argv[1:]:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                value = getattr(value, attr)
        except AttributeError:
            missing.append(name)
        break
    else:
        missing.append(name)
print(json.dumps(missing))
"""


def mentioned(text: str) -> tuple[set[str], set[str]]:
    """Backticked module paths (``energon/...``) and dotted names (``energon.x.y``) in ``text``."""
    tokens = {t.removesuffix("()") for t in re.findall(r"`([^`\s]+)`", text)}
    paths = {t for t in tokens if re.fullmatch(r"energon/[\w/.]*", t)}
    names = {t for t in tokens if re.fullmatch(r"energon(\.[A-Za-z_]\w*)+", t)}
    return paths, names


def test_internals_doc_is_generated_from_the_code():
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "docs" / "gen_internals.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_module_path_mentioned_exists():
    paths, _ = mentioned(DOC.read_text())
    assert len(paths) > 100  # the module map: one row per module
    assert sorted(p for p in paths if not (REPO_ROOT / p).exists()) == []


def test_every_dotted_name_mentioned_exists():
    """Imported in a fresh interpreter (some modules, like the megatron alias, act on import)."""
    _, names = mentioned(DOC.read_text())
    assert len(names) > 30  # the contracts name their code
    proc = run_fresh(_RESOLVE, *sorted(names))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == []


def test_name_check_finds_stale_names():
    """The resolver reports what does not exist (the page once named a long-gone ``read_raw``)."""
    proc = run_fresh(
        _RESOLVE,
        "energon.format.tar.split_sample_bytes",
        "energon.format.tar.read_raw",
        "energon.no_such_module",
    )
    assert json.loads(proc.stdout) == [
        "energon.format.tar.read_raw",
        "energon.no_such_module",
    ]
