"""Runs a doc's walk-through as written: its ``python`` and ``bash`` blocks, in order, in an empty
folder; a block that starts with ``# name.py`` becomes that file instead of running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO_ROOT

BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def run_walkthrough(doc: str, folder: Path, env: dict[str, str] | None = None) -> str:
    """The blocks' standard output, joined; a failing block fails the test with its output."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = str(REPO_ROOT)
    environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + environ["PATH"]
    environ.update(env or {})
    outputs = []
    for language, code in BLOCK.findall((REPO_ROOT / "docs" / doc).read_text()):
        name = re.match(r"# (\w+\.py)\n", code)
        if name:
            (folder / name.group(1)).write_text(code)
            continue
        command = ["bash", "-e", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(
            command, cwd=folder, env=environ, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{code}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        outputs.append(proc.stdout)
    return "\n".join(outputs)
