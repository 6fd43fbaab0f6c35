"""The reference's whole importable surface resolves through ``energon.megatron_alias``.

``tools/compat/surface.py`` dumps what megatron-energon 7.4 offers (side venv: every public module,
class, function, click command and constant, each class's public members, every signature) and
looks each piece up through the alias. Every module must import; at least 95% of the public names
must resolve; for the classes users call, subclass or invoke, every remaining difference must be one
of the documented ones (``tools/compat/surface_docs.py``); and docs/compat.md must show the numbers
and gaps of this very run (regenerate it with the command in its section).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

pytestmark = pytest.mark.compat

TOOL = REPO_ROOT / "tools" / "compat" / "surface.py"
DOCS = REPO_ROOT / "docs" / "compat.md"


def _run(python: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if python == sys.executable:
        env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [python, str(TOOL), *args], capture_output=True, text=True, timeout=600, env=env, cwd="/"
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def measured(ref_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("surface")
    surface, gaps, docs = folder / "surface.json", folder / "gaps.json", folder / "compat.md"
    _run(ref_python, "dump", str(surface))
    shutil.copy(DOCS, docs)
    _run(sys.executable, "check", str(surface), "--json", str(gaps), "--docs", str(docs))
    return json.loads(gaps.read_text()), docs.read_text()


def test_every_module_imports(measured):
    report, _ = measured
    done, total = report["numbers"]["modules"]
    assert total >= 115 and done == total, report["gaps"]["modules"]


def test_at_least_95_percent_of_public_names_resolve(measured):
    report, _ = measured
    done, total = report["numbers"]["names"]
    assert total > 1000 and done >= 0.95 * total, report["gaps"]["names"]


def test_every_remaining_gap_has_a_documented_reason(measured):
    report, _ = measured
    assert report["user_checked"]["members"] > 250 and report["user_checked"]["commands"] >= 19
    assert report["unexplained"] == []


def test_docs_show_this_run(measured):
    _, regenerated = measured
    assert DOCS.read_text() == regenerated, (
        "docs/compat.md is stale: run tools/compat/surface.py dump (reference venv) and check "
        "--docs docs/compat.md (see its section)"
    )
