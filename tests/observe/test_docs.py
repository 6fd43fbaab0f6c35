"""docs/observability.md runs as written: its ``python`` and ``bash`` blocks, in order, in an empty
folder (``train.py`` blocks become the file they name)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.helpers.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "observability.md"
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def test_observability_walkthrough_runs(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
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
    assert "micro-batches per rank per epoch: 136" in text
    assert "leaf listed twice" in text and "fewer slices than readers" in text
    assert "one worker: about" in text
    assert (tmp_path / "report.html").stat().st_size > 10_000
    stats = json.loads(text[text.index("{") : text.rindex("}") + 1])
    assert stats["batches"] == 100
    assert stats["stage_seconds"]["decode"] > 0
    assert text.rstrip().endswith("True 0")
