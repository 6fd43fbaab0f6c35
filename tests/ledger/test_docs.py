"""The walk-through in docs/ledger.md runs as written: its ``python`` and ``bash`` blocks, in order,
in an empty folder (``train.py`` blocks become the file they name)."""

from __future__ import annotations

import os

from tests.helpers.doc_walkthrough import run_walkthrough


def test_ledger_walkthrough_runs(tmp_path):
    text = run_walkthrough(
        "ledger.md",
        tmp_path,
        {"ENERGON_CACHE_DIR": os.environ.get("ENERGON_CACHE_DIR", str(tmp_path / "cache"))},
    )
    assert "[skipped, simulated]" in text  # step 45 after the skip
    assert "[seen, journal]" in text  # step 50 from the journal
    assert "edit: skipped positions 80..99" in text
    assert "continues (keeps its place)" in text and "added (starts at its beginning)" in text
    # the samples of step 47: never seen, once in the skipped steps
    lines = [line for line in text.splitlines() if "times; in skipped steps" in line]
    assert len(lines) == 8 and all(" seen 0 times; in skipped steps 1 times" in x for x in lines)
