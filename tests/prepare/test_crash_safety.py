"""``prepare`` is crash-safe and exclusive: ``kill -9`` at seeded moments (counted file-system
events, no timing) never leaves a dataset that looks prepared but is not; the next run cleans up
and succeeds; a second concurrent prepare fails clearly; bad member names and duplicate keys are
errors naming where they are."""

from __future__ import annotations

import io
import os
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from energon import WorkerConfig, get_loader, get_val_dataset
from energon.errors import DuplicateSampleKeyError, PrepareError, TarFormatError
from energon.format.info import has_info
from energon.prepare.dataset import prepare_dataset
from energon.source.shard_reader import reset_shard_reader
from tests.helpers.datasets import make_text_dataset
from tests.helpers.paths import REPO_ROOT

# Runs `energon prepare` in a child process that kills itself with SIGKILL at the N-th file-system
# event (a file opened for writing, a rename, a removal, a folder made); N = 0 never kills and
# prints how many events a whole run has. With a "pause" file given, the child instead stops at
# its first rename (holding the prepare lock), says so through "<pause>.ready" and waits for
# "<pause>.go" (bounded by a count of polls, not by a time limit on the other side).
CHILD = r"""
import builtins, os, shutil, signal, sys, time
kill_at, pause, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
count = 0

def event():
    global count
    count += 1
    if count == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

def wrap(fn, paused=False):
    def wrapper(*a, **k):
        event()
        if paused and pause and not os.path.exists(pause + ".ready"):
            open(pause + ".ready", "w").close()
            for _ in range(60000):
                if os.path.exists(pause + ".go"):
                    break
                time.sleep(0.01)
        return fn(*a, **k)
    return wrapper

os.replace = wrap(os.replace, paused=True)
os.rename = wrap(os.rename)
os.unlink = wrap(os.unlink)
os.mkdir = wrap(os.mkdir)
shutil.rmtree = wrap(shutil.rmtree)
real_open = builtins.open
def counting_open(file, mode="r", *a, **k):
    if any(c in mode for c in "wax+"):
        event()
    return real_open(file, mode, *a, **k)
builtins.open = counting_open

from energon.cli.main import cli
try:
    cli(args, standalone_mode=False)
finally:
    print("EVENTS", count)
"""

PREPARE_ARGS = [
    "prepare",
    "--non-interactive",
    "--split-ratio",
    "1,0,0",
    "--sample-type",
    "TextSample",
    "--field-map",
    '{"text": "txt"}',
    "--num-workers",
    "1",
    "--no-progress",
    "--checksums",
]
TRIALS = 10


def run_child(
    root: Path, kill_at: int, *extra: str, pause: str = ""
) -> subprocess.CompletedProcess:
    # no .pyc writes: they would be counted as events, and only the first runs make them
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    args = [*PREPARE_ARGS, *extra, str(root)]
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(kill_at), pause, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def loaded_keys(root: Path) -> list[str]:
    reset_shard_reader()
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(root, split_part="train", worker_config=wc, batch_size=None)
    return [s.__key__ for s in get_loader(dataset)]


def leftovers(root: Path) -> list[str]:
    names = [p.relative_to(root).as_posix() for p in root.rglob("*")]
    return [n for n in names if n.endswith((".tmp", ".old", ".lock")) or ".tmp/" in n]


@pytest.fixture(scope="module")
def shards_only(tmp_path_factory) -> Path:
    """Text shards, not prepared."""
    root = make_text_dataset(tmp_path_factory.mktemp("crash"), num_samples=30, num_shards=3)
    import shutil

    shutil.rmtree(root / ".nv-meta")
    for index in root.rglob("*.tar.idx"):
        index.unlink()
    return root


@pytest.fixture(scope="module")
def events_of_a_whole_run(shards_only, tmp_path_factory) -> int:
    import shutil

    root = Path(shutil.copytree(shards_only, tmp_path_factory.mktemp("count") / "ds"))
    proc = run_child(root, 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = int(re.search(r"EVENTS (\d+)", proc.stdout).group(1))
    assert events > 10
    return events


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill_9_during_a_first_prepare_never_leaves_a_half_prepared_dataset(
    shards_only, events_of_a_whole_run, tmp_path, trial
):
    import shutil

    rng = random.Random(trial)
    # the last events (dataset.yaml, .info.json) are where a wrong order would show: half the
    # trials aim there, the rest anywhere
    lo = 1 if trial % 2 else max(1, events_of_a_whole_run - 8)
    kill_at = rng.randint(lo, events_of_a_whole_run)
    root = Path(shutil.copytree(shards_only, tmp_path / "ds"))
    proc = run_child(root, kill_at)
    assert proc.returncode == -9, (kill_at, proc.stdout[-2000:], proc.stderr[-2000:])
    if has_info(root):  # it looks prepared: then it is, completely
        assert (root / ".nv-meta" / "dataset.yaml").is_file(), kill_at
        assert len(loaded_keys(root)) == 30
    again = run_child(root, 0, "--force-overwrite")
    assert again.returncode == 0, (kill_at, again.stdout[-2000:], again.stderr[-2000:])
    assert leftovers(root) == []
    assert len(loaded_keys(root)) == 30


def test_a_killed_re_prepare_keeps_a_prepared_dataset_loadable(shards_only, tmp_path):
    import shutil

    root = Path(shutil.copytree(shards_only, tmp_path / "ds"))
    assert run_child(root, 0).returncode == 0
    expected = sorted(loaded_keys(root))
    assert len(expected) == 30
    whole = run_child(root, 0, "--force-overwrite")  # the events of a whole re-prepare
    assert whole.returncode == 0, whole.stderr[-3000:]
    events = int(re.search(r"EVENTS (\d+)", whole.stdout).group(1))
    rng = random.Random(99)
    for kill_at in sorted(rng.sample(range(1, events), 4)):
        proc = run_child(root, kill_at, "--force-overwrite")
        assert proc.returncode == -9, (kill_at, events, proc.stdout[-2000:])
        assert sorted(loaded_keys(root)) == expected
        # the next run continues the killed one (fewer events than a whole run): it finishes
        # here, so that each kill interrupts a whole re-prepare
        finished = run_child(root, 0, "--force-overwrite")
        assert finished.returncode == 0, (kill_at, finished.stderr[-2000:])
        assert sorted(loaded_keys(root)) == expected


def test_a_second_prepare_of_the_same_folder_fails_clearly(shards_only, tmp_path):
    import shutil

    root = Path(shutil.copytree(shards_only, tmp_path / "ds"))
    pause = str(tmp_path / "pause")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.Popen(
        [sys.executable, "-c", CHILD, "0", pause, *PREPARE_ARGS, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        for _ in range(60000):  # the child holds the lock once it reaches its first rename
            if os.path.exists(pause + ".ready") or first.poll() is not None:
                break
            __import__("time").sleep(0.01)
        assert os.path.exists(pause + ".ready"), first.communicate()
        with pytest.raises(PrepareError, match=rf"another `energon prepare` \(pid {first.pid}\)"):
            prepare_dataset(root, progress=False, num_workers=1)
        second = run_child(root, 0)
        assert second.returncode != 0 and "another `energon prepare`" in second.stderr
        Path(pause + ".go").touch()
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, err[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert leftovers(root) == []
    assert len(loaded_keys(root)) == 30
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)  # free again


def test_temp_files_of_killed_runs_are_removed_by_the_next_prepare(shards_only, tmp_path):
    import shutil

    root = Path(shutil.copytree(shards_only, tmp_path / "ds"))
    (root / ".nv-meta").mkdir()
    stale = [
        root / ".nv-meta" / ".index.sqlite.0123456789ab.tmp",
        root / ".nv-meta" / "..info.json.0123456789ab.tmp",
        root / "parts" / "data-00000.tar.idx.0123456789ab.tmp",
    ]
    for path in stale:
        path.write_bytes(b"partial")
    (root / ".nv-meta" / ".checksums.0123456789ab.tmp" / "parts").mkdir(parents=True)
    keep = root / "parts" / "notes.tmp"  # not ours
    keep.write_text("user file")
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
    assert not any(p.exists() for p in stale)
    assert not (root / ".nv-meta" / ".checksums.0123456789ab.tmp").exists()
    assert keep.read_text() == "user file"


def write_tar(path: Path, names: list[str], encoding: str = "utf-8") -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding=encoding) as tf:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 5
            tf.addfile(info, io.BytesIO(b"hello"))


def test_a_non_utf8_member_name_names_shard_and_offset(tmp_path):
    write_tar(tmp_path / "a.tar", ["ok.txt", "b\xe9d.txt", "z.txt"], encoding="latin-1")
    with pytest.raises(
        TarFormatError,
        match=r"a\.tar: at byte offset 1024: member name b'b\\xe9d\.txt' is not valid UTF-8",
    ):
        prepare_dataset(tmp_path, progress=False, num_workers=1)
    assert not has_info(tmp_path)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_the_duplicate_key_error_names_the_key_and_both_places(tmp_path, num_workers):
    write_tar(tmp_path / "a.tar", ["k1.txt", "k2.txt", "k3.txt"])
    write_tar(tmp_path / "b.tar", ["k4.txt", "k5.txt", "k2.txt"])
    with pytest.raises(DuplicateSampleKeyError) as raised:
        prepare_dataset(tmp_path, progress=False, num_workers=num_workers)
    e = raised.value
    assert (e.key, e.first, e.second) == (
        "k2",
        "shard a.tar at byte offset 1024",
        "shard b.tar at byte offset 2048",
    )
    assert not has_info(tmp_path) and leftovers(tmp_path) == []


def test_prepare_and_prepare_media_share_the_lock(shards_only, tmp_path):
    import shutil

    from energon.format.layout import prepare_lock
    from energon.media.extract import MediaFilterConfig
    from energon.prepare.media import prepare_webdataset_media

    root = Path(shutil.copytree(shards_only, tmp_path / "ds"))
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
    config = MediaFilterConfig.parse(glob="*.txt", header=False, extension=False)
    with prepare_lock(root):  # another process's run, as far as flock is concerned
        with pytest.raises(PrepareError, match="another `energon prepare`"):
            prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False)
        with pytest.raises(PrepareError, match="another `energon prepare`"):
            prepare_webdataset_media(root, config, num_workers=1, progress=False)
    prepare_webdataset_media(root, config, num_workers=1, progress=False)
    assert leftovers(root) == []
