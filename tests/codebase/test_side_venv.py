"""The side venvs' disk sharing: a file equal to its twin at the same place in another venv becomes
a hard link to it; a different file, or one with no twin, is left alone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.helpers.side_venv import (
    SUITE_HEADROOM_GIB,
    build_once,
    disk_shortfall,
    ensure_venv,
    run_steps,
    share_identical_files,
)


def _site(venv: Path) -> Path:
    path = (
        venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    path.mkdir(parents=True)
    return path


def test_identical_files_become_one_and_others_stay(tmp_path):
    older, newer = _site(tmp_path / "older-venv"), _site(tmp_path / "newer-venv")
    for site, tail in ((older, b"A"), (newer, b"B")):
        (site / "torch").mkdir()
        (site / "torch" / "lib.so").write_bytes(b"x" * 5000)
        (site / "torch" / "version.py").write_bytes(b"v" * 99 + tail)  # same size, other bytes
    (newer / "only_here.py").write_bytes(b"mine")

    freed = share_identical_files(tmp_path / "newer-venv")

    assert freed == 5000
    assert (newer / "torch" / "lib.so").stat().st_ino == (older / "torch" / "lib.so").stat().st_ino
    assert (newer / "torch" / "lib.so").read_bytes() == b"x" * 5000
    assert (newer / "torch" / "version.py").read_bytes().endswith(b"B")
    assert (newer / "torch" / "version.py").stat().st_nlink == 1
    assert (newer / "only_here.py").read_bytes() == b"mine"
    assert share_identical_files(tmp_path / "newer-venv") == 0  # already shared: nothing more
    assert not list(newer.rglob("*.energon-link"))


def test_a_short_disk_is_a_reason_not_an_attempt(tmp_path):
    assert disk_shortfall(tmp_path, -SUITE_HEADROOM_GIB) is None  # nothing wanted: always fits
    reason = disk_shortfall(tmp_path, 10**9)
    assert reason is not None and "GiB free" in reason and str(tmp_path) in reason


def test_a_venv_is_made_once_and_its_marker_keeps_it(tmp_path):
    directory, marker = tmp_path / "side-venv", tmp_path / "side-venv" / ".ready"
    assert ensure_venv(directory, (), marker, needs_gib=0.0) is None
    assert marker.is_file() and (directory / "bin" / "python").exists()
    (directory / "kept").write_text("made by the first call")
    assert ensure_venv(directory, (), marker, needs_gib=0.0) is None  # not made again
    assert (directory / "kept").is_file()
    too_big = ensure_venv(tmp_path / "other", (), tmp_path / "other.ready", needs_gib=10**9)
    assert too_big is not None and "GiB free" in too_big
    assert not (tmp_path / "other").exists()


def test_a_failed_build_is_tried_once_per_test_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-1")
    directory, marker = tmp_path / "side-venv", tmp_path / "side-venv" / ".ready"
    attempts = []

    def failing_build() -> str:
        attempts.append(1)
        return "pip install nothing failed: no index"

    assert build_once(directory, marker, failing_build) == "pip install nothing failed: no index"
    again = build_once(directory, marker, failing_build)  # another worker of the same run
    assert again == "(an earlier attempt in this run) pip install nothing failed: no index"
    assert len(attempts) == 1
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "run-2")  # a later run tries again
    assert build_once(directory, marker, lambda: directory.mkdir()) is None
    assert marker.is_file() and not (tmp_path / "side-venv.failed").exists()


def test_a_step_past_the_deadline_is_a_reason_not_a_wait():
    stalled = [sys.executable, "-c", "import time; time.sleep(600)"]
    reason = run_steps([stalled], deadline=0.0)  # long past: each step still gets 1 s
    assert reason is not None and "did not finish" in reason
    assert run_steps([[sys.executable, "-c", "pass"]], deadline=time.monotonic() + 600) is None
