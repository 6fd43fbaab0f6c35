"""Computing media metadata for a prepared WebDataset or a plain media folder.

The work is spread over processes (one task per shard, or per batch of files) because extraction
is CPU-bound (AV metadata may demux or decode). Results are written through a temporary copy of
``index.sqlite`` that is renamed into place, so an interrupted run leaves the old index intact.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from energon.errors import DatasetNotPreparedError
from energon.format.info import has_info, read_info
from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    MAIN_FOLDER_NAME,
    PathLike,
    nv_meta_dir,
    prepare_lock,
    remove_quietly,
    temp_name_for,
)
from energon.format.media_metadata import serialize_media_metadata
from energon.format.processes import process_context
from energon.format.split_shards import refresh_shard_table
from energon.format.sqlite_index import MEDIA_SCHEMA, sample_tables_path, write_index_uuid
from energon.format.tar import scan_tar
from energon.media.extract import MediaFilterConfig, extract_media_metadata
from energon.media.store import MediaRow, record_media_filter, replace_media_rows

__all__ = [
    "media_rows_for_samples",
    "prepare_folder_media",
    "prepare_webdataset_media",
]

#: Files per task when preparing a folder (small enough to balance, large enough to amortise IPC).
_FILES_PER_TASK = 64


def _row_for(name: str, data: bytes, config: MediaFilterConfig) -> MediaRow | None:
    media_type = config.media_type(name, data)
    if media_type is None:
        return None
    metadata = extract_media_metadata(name, data, media_type)
    if metadata is None:
        return None
    return (name, *serialize_media_metadata(metadata))


def media_rows_for_samples(
    f: BinaryIO,
    samples: Iterable[tuple[str, int, list[tuple[str, int, int]]]],
    config: MediaFilterConfig,
) -> list[MediaRow]:
    """Rows for the parts of scanned tar samples (``(key, header offset, [(part, offset, size)])``).

    Only parts the filter may select are read (every part for HEADER).
    """
    rows: list[MediaRow] = []
    for key, _, parts in samples:
        for part, offset, size in parts:
            entry = f"{key}.{part}"
            if not config.needs_content and config.candidate_type(entry) is None:
                continue
            f.seek(offset)
            row = _row_for(entry, f.read(size), config)
            if row is not None:
                rows.append(row)
    return rows


@dataclass(frozen=True)
class _ShardMediaTask:
    tar_path: str
    config: MediaFilterConfig


def _shard_media_rows(task: _ShardMediaTask) -> list[MediaRow]:
    scan = scan_tar(task.tar_path)
    with open(task.tar_path, "rb") as f:
        return media_rows_for_samples(f, scan.samples, task.config)


@dataclass(frozen=True)
class _FilesTask:
    root: str
    names: tuple[str, ...]
    config: MediaFilterConfig


def _files_media_rows(task: _FilesTask) -> list[MediaRow]:
    rows = []
    for name in task.names:
        with open(os.path.join(task.root, name), "rb") as f:
            row = _row_for(name, f.read(), task.config)
        if row is not None:
            rows.append(row)
    return rows


def _run_tasks(
    function: Callable,
    tasks: Sequence,
    num_workers: int,
    progress: bool,
    unit: str,
    weights: Sequence[int],
) -> Iterator[list[MediaRow]]:
    """Run tasks in a process pool (in-process for one worker), in order, with a progress bar.

    The pool is started here, before the caller opens any database, so workers inherit none.
    """
    if num_workers <= 1 or len(tasks) <= 1:
        return _with_progress(map(function, tasks), None, progress, unit, weights)
    pool = process_context().Pool(min(num_workers, len(tasks)))
    return _with_progress(pool.imap(function, tasks), pool, progress, unit, weights)


def _with_progress(
    results: Iterator[list[MediaRow]], pool: Any, progress: bool, unit: str, weights: Sequence[int]
) -> Iterator[list[MediaRow]]:
    bar = tqdm(total=sum(weights), desc="Computing media metadata", unit=unit, disable=not progress)
    try:
        for weight, rows in zip(weights, results):
            yield rows
            bar.update(weight)
        if pool is not None:
            pool.close()
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()


def _write_media_index(
    db_path: Path, rows: Iterator[list[MediaRow]], config: MediaFilterConfig, *, fresh: bool
) -> int:
    """Fill the media tables of a copy of ``db_path`` (or a new database) and rename it into place."""
    tmp = temp_name_for(db_path)
    try:
        if not fresh:
            shutil.copyfile(db_path, tmp)
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            for statement in MEDIA_SCHEMA:
                db.execute(statement.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
            db.execute("BEGIN")
            db.execute("DELETE FROM media_metadata")  # the new filter replaces the old result
            db.execute("DELETE FROM media_filters")
            written = sum(replace_media_rows(db, batch) for batch in rows)
            record_media_filter(db, config.strategy.value, config.patterns_column)
            db.execute("COMMIT")
        finally:
            db.close()
        os.replace(tmp, db_path)
    except BaseException:
        remove_quietly(tmp)
        raise
    write_index_uuid(db_path.parent.parent)
    refresh_shard_table(db_path.parent.parent)  # it names the index.uuid it belongs to
    return written


def prepare_webdataset_media(
    root: PathLike, config: MediaFilterConfig, *, num_workers: int = 16, progress: bool = True
) -> int:
    """Add media metadata to a prepared WebDataset's ``index.sqlite``; returns the row count."""
    root = Path(root)
    db_path = nv_meta_dir(root) / INDEX_SQLITE_FILENAME
    if not has_info(root):
        raise DatasetNotPreparedError(
            f"{root} is not a prepared dataset: run `energon prepare` first"
        )
    sample_tables_path(str(root), "prepare-media (media metadata lives in them)")
    with prepare_lock(root):  # not while a prepare replaces index.sqlite
        shards = list(read_info(root))
        tasks = [_ShardMediaTask(str(root / shard), config) for shard in shards]
        rows = _run_tasks(
            _shard_media_rows, tasks, num_workers, progress, "shard", [1] * len(tasks)
        )
        return _write_media_index(db_path, rows, config, fresh=False)


def _folder_files(root: Path) -> list[str]:
    """Every file below ``root`` (POSIX paths relative to it), without ``.nv-meta``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != MAIN_FOLDER_NAME)
        rel_dir = Path(dirpath).relative_to(root)
        found.extend((rel_dir / name).as_posix() for name in filenames)
    return sorted(found)


def prepare_folder_media(
    root: PathLike, config: MediaFilterConfig, *, num_workers: int = 16, progress: bool = True
) -> int:
    """Create ``.nv-meta/index.sqlite`` with media metadata for a plain folder (an aux source);
    keys are POSIX paths relative to ``root``. Returns the row count."""
    root = Path(root)
    names = _folder_files(root)
    if not config.needs_content:
        names = [n for n in names if config.candidate_type(n) is not None]
    batches = [tuple(names[i : i + _FILES_PER_TASK]) for i in range(0, len(names), _FILES_PER_TASK)]
    tasks = [_FilesTask(str(root), batch, config) for batch in batches]
    meta = nv_meta_dir(root)
    meta.mkdir(exist_ok=True)
    db_path = meta / INDEX_SQLITE_FILENAME
    with prepare_lock(root):
        rows = _run_tasks(
            _files_media_rows, tasks, num_workers, progress, "file", [len(b) for b in batches]
        )
        return _write_media_index(db_path, rows, config, fresh=True)
