"""The walk-through in docs/ledger.md runs as written: its ``python`` and ``bash`` blocks, in order,
in an empty folder (``train.py`` blocks become the file they name)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "ledger.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def test_ledger_walkthrough_runs(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    env["ENERGON_CACHE_DIR"] = env.get("ENERGON_CACHE_DIR", str(tmp_path / "cache"))
    outputs = []
    for language, code in BLOCK.findall(DOC.read_text()):
        name = re.match(r"# (\w+\.py)\n", code)
        if name:
            (tmp_path / name.group(1)).write_text(code)
            continue
        command = ["bash", "-e", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"{code}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        outputs.append(proc.stdout)
    text = "\n".join(outputs)
    assert "[skipped, simulated]" in text  # step 45 after the skip
    assert "[seen, journal]" in text  # step 50 from the journal
    assert "edit: skipped positions 80..99" in text
    assert "continues (keeps its place)" in text and "added (starts at its beginning)" in text
    # the samples of step 47: never seen, once in the skipped steps
    lines = [line for line in text.splitlines() if "times; in skipped steps" in line]
    assert len(lines) == 8 and all(" seen 0 times; in skipped steps 1 times" in x for x in lines)
