"""``prepare`` at scale: a killed run is continued, not started over, and gives the files a run
from scratch gives; ``--no-sample-tables`` writes only what training reads, and the tools that
need the per-sample tables say so."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.cli.main import cli
from energon.errors import SampleTablesMissingError
from energon.prepare.work import WORK_FOLDER_NAME
from energon.source.meta import meta_reader
from energon.source.webdataset import WebdatasetLeaf
from tests.helpers.datasets import make_text_dataset
from tests.helpers.paths import REPO_ROOT
from tests.helpers.tarfiles import write_tar

# `energon prepare` in a child that kills itself (SIGKILL) when its N-th chunk is finished (the
# rename of a chunk folder into place), or ("removal") just after it deleted the first chunk's
# meta.json while removing the work folder at the end; it prints how many chunks it finished
# (when it is not killed).
CHILD = r"""
import os, signal, sys
when, kill_at, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
finished = 0
real_replace, real_unlink = os.replace, os.unlink

def replace(src, dst, *a, **k):
    global finished
    result = real_replace(src, dst, *a, **k)
    if os.path.basename(str(dst)).startswith("chunk-"):
        finished += 1
        if when == "chunk" and finished == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return result

def unlink(path, *a, **k):
    result = real_unlink(path, *a, **k)
    if when == "removal" and os.path.basename(str(path)) == "meta.json":
        os.kill(os.getpid(), signal.SIGKILL)
    return result

os.replace, os.unlink = replace, unlink
from energon.cli.main import cli
try:
    cli(args, standalone_mode=False)
finally:
    print("CHUNKS", finished)
"""
ARGS = [
    "prepare",
    "--non-interactive",
    "--split-ratio",
    "3,1,0",
    "--sample-type",
    "TextSample",
    "--field-map",
    '{"text": "txt"}',
    "--num-workers",
    "1",
    "--no-progress",
    "--checksums",
]


def _prepare(
    root: Path, kill_at: int = 0, when: str = "chunk", *extra: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, when, str(kill_at), *ARGS, *extra, str(root)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=600,
    )


def _files(root: Path) -> dict[str, bytes]:
    """Every generated file, the random ``index.uuid`` blanked where it is named."""
    files = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".tar")
    }
    uuid = files.pop(".nv-meta/index.uuid")
    return {name: data.replace(uuid, b"-" * len(uuid)) for name, data in files.items()}


def _shards_only(root: Path) -> Path:
    make_text_dataset(root, num_samples=96, num_shards=8)
    for path in [*root.rglob("*.tar.idx"), *(root / ".nv-meta").iterdir()]:
        path.unlink()
    return root


def _hashed_shards_only(root: Path) -> Path:
    """Keys in no order (hashed names): ``index.sqlite``'s key index is built at the end."""
    for shard in range(8):
        numbers = range(shard * 12, shard * 12 + 12)
        members = [(f"{hashlib.md5(b'%d' % n).hexdigest()}.txt", b"text %d" % n) for n in numbers]
        write_tar(root / "parts" / f"data-{shard:05d}.tar", members)
    return root


@pytest.mark.parametrize("shards_only", [_shards_only, _hashed_shards_only])
def test_a_killed_prepare_continues_and_writes_what_a_clean_run_writes(tmp_path, shards_only):
    clean, killed = shards_only(tmp_path / "clean"), shards_only(tmp_path / "killed")
    done = _prepare(clean)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CHUNKS 8" in done.stdout  # one chunk per shard at this size
    first = _prepare(killed, kill_at=4)
    assert first.returncode == -9
    assert not (killed / ".nv-meta" / ".info.json").exists()
    work = killed / ".nv-meta" / WORK_FOLDER_NAME
    # four chunks were finished; the index being built holds the first three (the fourth was
    # finished at the kill), and their own rows went
    index = sqlite3.connect(work / "index.sqlite")
    assert index.execute("SELECT count(*) FROM samples").fetchone() == (36,)
    index.close()
    rows = [(work / f"chunk-00000{c}" / "rows.sqlite").exists() for c in range(4)]
    assert rows == [False, False, False, True]
    # a finished chunk whose files are not all there, whole, is scanned again (not merged again)
    idx = work / "chunk-000001" / "idx" / "0.idx"
    idx.write_bytes(idx.read_bytes()[:8])
    (work / "chunk-000002" / "idx" / "0.idx").unlink()
    again = _prepare(killed)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "CHUNKS 6" in again.stdout  # chunks 0 and 3 were not scanned again
    assert not work.exists()
    assert _files(killed) == _files(clean)


def test_an_index_built_in_tmp_path_is_continued_there_and_left_nowhere(tmp_path):
    """``--tmp-path``: the index is built there under a name of its dataset's own; a killed
    run's index is continued from the same folder, and one left in a folder no longer named
    is removed (the chunks it held are then scanned again)."""
    clean, killed = _shards_only(tmp_path / "clean"), _shards_only(tmp_path / "killed")
    scratch, other = tmp_path / "scratch", tmp_path / "other"
    assert _prepare(clean).returncode == 0
    assert _prepare(killed, 4, "chunk", "--tmp-path", str(scratch)).returncode == -9
    (left,) = scratch.iterdir()
    assert re.fullmatch(r"\.energon-index-[0-9a-f]{16}\.sqlite", left.name)
    assert sqlite3.connect(left).execute("SELECT count(*) FROM samples").fetchone() == (36,)
    # continued there: killed when the third of the chunks left was finished (4, 5, 6)
    assert _prepare(killed, 3, "chunk", "--tmp-path", str(scratch)).returncode == -9
    assert list(scratch.iterdir()) == [left]
    assert sqlite3.connect(left).execute("SELECT count(*) FROM samples").fetchone() == (72,)
    again = _prepare(killed, 0, "chunk", "--tmp-path", str(other))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "CHUNKS 7" in again.stdout  # all but chunk 6 (finished, not merged: it has its rows)
    assert list(scratch.iterdir()) == [] and list(other.iterdir()) == []
    assert _files(killed) == _files(clean)


def test_a_changed_shard_in_what_the_index_holds_builds_it_again(tmp_path):
    """A shard of a chunk the index holds changed after the kill: its rows there are stale, so
    the index is built again from scratch, and the chunks whose rows it held are scanned again."""
    clean, killed = _shards_only(tmp_path / "clean"), _shards_only(tmp_path / "killed")
    first = _prepare(killed, kill_at=4)
    assert first.returncode == -9
    for root in (clean, killed):  # the same new content in both
        shard = sorted((root / "parts").glob("*.tar"))[1]
        write_tar(shard, [(f"changed{n:03d}.txt", b"new text %d" % n) for n in range(5)])
    assert _prepare(clean).returncode == 0
    again = _prepare(killed)
    assert again.returncode == 0, again.stderr[-2000:]
    # the chunks the index held lost their rows: scanned again, all but the fourth (not merged)
    assert "CHUNKS 7" in again.stdout
    assert _files(killed) == _files(clean)


def test_a_prepare_killed_while_removing_its_work_folder_leaves_none_to_trip_over(tmp_path):
    """The work folder goes in one step (renamed, then deleted): a kill in the middle of the
    deletion left chunks that looked finished without their rows, which a re-prepare of the same
    shards took as finished ('no such table: chunk.samples')."""
    root = _shards_only(tmp_path / "ds")
    killed = _prepare(root, 1, "removal")
    assert killed.returncode == -9
    assert (root / ".nv-meta" / ".info.json").is_file()
    assert not (root / ".nv-meta" / WORK_FOLDER_NAME).exists()
    again = _prepare(root, 0, "chunk", "--force-overwrite")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "CHUNKS 8" in again.stdout
    assert [p.name for p in (root / ".nv-meta").iterdir() if p.name.endswith(".tmp")] == []
    assert len(set(_train_keys(root))) == 24


def test_without_sample_tables_training_loads_and_key_lookups_say_what_to_do(tmp_path):
    full, lean = _shards_only(tmp_path / "full"), _shards_only(tmp_path / "lean")
    assert _prepare(full).returncode == 0
    for root in (full, lean):
        (root / ".nv-meta" / "dataset.yaml").write_text(
            (full / ".nv-meta" / "dataset.yaml").read_text()
        )
    result = CliRunner().invoke(
        cli,
        [
            "prepare",
            "--non-interactive",
            "--split-ratio",
            "3,1,0",
            "--no-sample-tables",
            "--skip-dataset-yaml",
            "--no-progress",
            str(lean),
        ],
    )
    assert result.exit_code == 0, result.output
    assert not (lean / ".nv-meta" / "index.sqlite").exists()
    assert _train_keys(lean) == _train_keys(full)
    leaf = WebdatasetLeaf.open(lean, split_part="train")
    with pytest.raises(SampleTablesMissingError, match=re.escape(f"--tar-index-only {lean}")):
        meta_reader(leaf).key(0)
    split = lean / ".nv-meta" / "split.yaml"
    shard = leaf.shards.name(0)
    split.write_text(split.read_text().replace("exclude: []", f"exclude:\n- {shard}/x"))
    with pytest.raises(SampleTablesMissingError, match="excluding samples by key"):
        WebdatasetLeaf.open(lean, split_part="train")
    result = CliRunner().invoke(cli, ["prepare", "--tar-index-only", "--no-progress", str(lean)])
    assert result.exit_code == 0, result.output
    assert meta_reader(WebdatasetLeaf.open(lean, split_part="train")).key(1) is not None


def _train_keys(root: Path) -> list[str]:
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        root, worker_config=wc, batch_size=4, shuffle_buffer_size=5, max_samples_per_sequence=5
    )
    it = iter(get_loader(ds))
    return [k for _ in range(6) for k in next(it).__key__]


def test_a_damaged_index_from_a_killed_run_is_built_again(tmp_path):
    """The index a killed run left is not an sqlite file any more: it is built again, and the
    chunks whose rows it held are scanned again."""
    clean, killed = _shards_only(tmp_path / "clean"), _shards_only(tmp_path / "killed")
    assert _prepare(clean).returncode == 0
    assert _prepare(killed, kill_at=4).returncode == -9
    (killed / ".nv-meta" / WORK_FOLDER_NAME / "index.sqlite").write_bytes(b"not sqlite" * 500)
    again = _prepare(killed)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "CHUNKS 7" in again.stdout  # all but chunk 3 (finished, not merged: it has its rows)
    assert _files(killed) == _files(clean)
