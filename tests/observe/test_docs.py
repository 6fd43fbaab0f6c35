"""docs/observability.md runs as written: its ``python`` and ``bash`` blocks, in order, in an empty
folder (``train.py`` blocks become the file they name)."""

from __future__ import annotations

import json

from tests.helpers.doc_walkthrough import run_walkthrough


def test_observability_walkthrough_runs(tmp_path):
    text = run_walkthrough("observability.md", tmp_path)
    assert "micro-batches per rank per epoch: 136" in text
    assert "leaf listed twice" in text and "fewer slices than readers" in text
    assert "one worker: about" in text
    assert (tmp_path / "report.html").stat().st_size > 10_000
    stats = json.loads(text[text.index("{") : text.index("\nTrue 0")])
    assert stats["batches"] == 100
    assert stats["stage_seconds"]["decode"] > 0
    assert "True 0" in text.splitlines()
    assert (
        "was killed by signal SIGKILL on 00000_000031 in parts/data-00000.tar -> "
        "replaced; sample skipped\n{'WorkerLostError': 1}"
    ) in text
