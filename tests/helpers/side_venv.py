"""Side venvs for tests that need packages the project venv cannot hold (the reference, a
torchvision that fits its own torch): created on first use under ``.cache/``, reused after. Not a
test module itself.

Each side venv holds its own torch (0.75-5 GB), and CI machines can be short of disk, so a new
side venv hard-links every file it shares byte for byte with the project venv or an earlier side
venv (the same torch wheel installed twice) instead of keeping a second copy."""

from __future__ import annotations

import fcntl
import filecmp
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# what the rest of the suite writes while it runs (test folders, prepared datasets, pip's unpacking)
SUITE_HEADROOM_GIB = 3.0


# A whole venv's build (every pip step): local builds take 1-3 minutes; a build past this is an
# unreachable or stalled package index, and the comparison is skipped with that reason instead of
# holding a test (and every worker waiting for the same venv) until CI's own limit.
BUILD_SECONDS = 600


def ensure_venv(
    directory: Path, pip_steps: Sequence[Sequence[str]], marker: Path, needs_gib: float
) -> str | None:
    """Create the venv at ``directory`` with ``pip_steps`` unless ``marker`` says it is complete;
    returns a reason string when it cannot be created. ``needs_gib`` is its size on disk after
    sharing files, so that a short disk skips this one comparison with the reason instead of
    failing the tests that run beside it."""
    return build_once(directory, marker, lambda: build_venv(directory, pip_steps, needs_gib))


def build_once(directory: Path, marker: Path, build: Callable[[], str | None]) -> str | None:
    """``build()`` unless ``marker`` exists, under a lock so that parallel workers build it once;
    the reason it failed, or None. A failure is kept for the rest of this test run (next to the
    lock), so the other workers skip at once instead of each trying again."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    failed = Path(f"{directory}.failed")
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return None
        earlier = _failure_in_this_run(failed)
        if earlier is not None:
            return earlier
        reason = build()
        if reason is None:
            marker.write_text("ok\n")
            failed.unlink(missing_ok=True)
        else:
            failed.write_text(f"{_test_run()}\n{reason}")
    return reason


def _test_run() -> str:
    """This pytest run (pytest-xdist gives its workers one id; without it, this process)."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"


def _failure_in_this_run(failed: Path) -> str | None:
    try:
        run, reason = failed.read_text().split("\n", 1)
    except (OSError, ValueError):
        return None
    return f"(an earlier attempt in this run) {reason}" if run == _test_run() else None


def build_venv(
    directory: Path,
    pip_steps: Sequence[Sequence[str]],
    needs_gib: float,
    deadline: float | None = None,
) -> str | None:
    """Make the venv afresh with ``pip_steps`` by ``deadline`` (``time.monotonic()``; default
    ``BUILD_SECONDS`` from now) and share its files with the other venvs; the reason when it
    cannot be made (no lock, no marker: the caller's)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    shortfall = disk_shortfall(directory.parent, needs_gib)
    if shortfall is not None:
        return shortfall
    python = directory / "bin" / "python"
    steps = [[sys.executable, "-m", "venv", "--clear", str(directory)]]
    steps += [pip_install(python, args) for args in pip_steps]
    if deadline is None:
        deadline = time.monotonic() + BUILD_SECONDS
    reason = run_steps(steps, deadline)
    if reason is None:
        share_identical_files(directory)
    return reason


def disk_shortfall(place: Path, needs_gib: float) -> str | None:
    """Why a venv of ``needs_gib`` should not be made at ``place`` now, or None if it fits."""
    free_gib = shutil.disk_usage(place).free / 2**30
    wanted = needs_gib + SUITE_HEADROOM_GIB
    if free_gib >= wanted:
        return None
    return (
        f"only {free_gib:.1f} GiB free at {place}: this venv takes about {needs_gib:.1f} GiB and "
        f"the rest of the suite {SUITE_HEADROOM_GIB:.0f} GiB"
    )


def pip_install(python: Path, args: Sequence[str]) -> list[str]:
    """A quiet ``pip install`` that leaves no wheel cache behind (it would be a third copy)."""
    return [str(python), "-m", "pip", "install", "-q", "--no-cache-dir", *args]


def run_steps(steps: Sequence[Sequence[str]], deadline: float) -> str | None:
    """Run commands in order, all by ``deadline`` (``time.monotonic()``); the first failure's
    command and stderr tail, or None."""
    for step in steps:
        command = " ".join(step[:6])
        try:
            proc = subprocess.run(
                step,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            return f"{command} did not finish within the {BUILD_SECONDS} s a side venv may take"
        if proc.returncode != 0:
            return f"{command} failed: {proc.stderr.strip()[-500:]}"
    return None


def share_identical_files(directory: Path) -> int:
    """Replace each file of the venv at ``directory`` that equals, byte for byte, the file at the
    same place in the project venv or another side venv beside it by a hard link to that file.
    Returns the bytes freed. A file that cannot be linked (another file system) stays as it is."""
    own = _site_packages(directory)
    others = [Path(sysconfig.get_paths()["purelib"])]
    others += [_site_packages(d) for d in sorted(directory.parent.iterdir()) if d != directory]
    others = [o for o in others if o.is_dir() and o != own]
    freed = 0
    for candidate in _plain_files(own):
        relative = candidate.relative_to(own)
        for other in others:
            linked = _link_if_identical(candidate, other / relative)
            if linked is not None:
                freed += linked
                break
    return freed


def _plain_files(root: Path) -> Iterator[Path]:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                yield path


def _link_if_identical(candidate: Path, twin: Path) -> int | None:
    """Bytes freed by linking ``candidate`` to an identical ``twin`` (0 when it already was one
    file), or None when they differ or cannot be linked."""
    try:
        if not twin.is_file() or twin.is_symlink():
            return None
        mine, theirs = candidate.stat(), twin.stat()
        if (mine.st_ino, mine.st_dev) == (theirs.st_ino, theirs.st_dev):
            return 0
        if mine.st_size != theirs.st_size or not filecmp.cmp(candidate, twin, shallow=False):
            return None
        staged = candidate.with_name(candidate.name + ".energon-link")
        os.link(twin, staged)
        os.replace(staged, candidate)
        return mine.st_size
    except OSError:
        return None


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"
