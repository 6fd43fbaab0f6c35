"""Names of the files in a prepared dataset, and its prepare lock.

All metadata is written to a temporary file next to its target and then renamed over it
(:mod:`energon.atomic`, re-exported here), so a reader (or an interrupted ``prepare``) only ever
sees a complete old or a complete new file; and every writer of a dataset's metadata
(``prepare``, ``prepare-media``) holds its prepare lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from energon.atomic import PathLike as PathLike
from energon.atomic import atomic_write_bytes as atomic_write_bytes
from energon.atomic import atomic_write_text as atomic_write_text
from energon.atomic import copy_permissions as copy_permissions
from energon.atomic import remove_quietly
from energon.atomic import temp_name_for as temp_name_for
from energon.errors import PrepareError

MAIN_FOLDER_NAME = ".nv-meta"
INFO_JSON_FILENAME = ".info.json"
INFO_YAML_FILENAME = ".info.yaml"
INDEX_SQLITE_FILENAME = "index.sqlite"
INDEX_UUID_FILENAME = "index.uuid"
SPLIT_YAML_FILENAME = "split.yaml"
DATASET_YAML_FILENAME = "dataset.yaml"
SAMPLE_LOADER_FILENAME = "sample_loader.py"
SHARD_TABLE_FILENAME = "shard_table.bin"  # energon's: the splits' shards, read block by block
CHECKSUMS_FOLDER_NAME = "checksums"  # optional: <shard>.crc32 per shard (prepare --checksums)
CHECKSUMS_SUFFIX = ".crc32"
PREPARE_LOCK_FILENAME = ".prepare.lock"  # held by a running prepare (flock)


def nv_meta_dir(root: PathLike) -> Path:
    """The ``.nv-meta`` folder of a dataset root."""
    return Path(root) / MAIN_FOLDER_NAME


@contextlib.contextmanager
def prepare_lock(root: PathLike) -> Iterator[None]:
    """Hold the dataset's prepare lock, or fail at once naming who holds it.

    ``flock`` on ``.nv-meta/.prepare.lock``: the kernel releases it when the holder exits, even on
    ``kill -9``, so a killed run never blocks the next. The file is removed when the run ends; a
    run that locked a file removed meanwhile tries again with the new one. (On network file
    systems this is as good as their ``flock``; remote ``s3://`` datasets have no lock, see
    docs/remote.md.)
    """
    path = nv_meta_dir(root) / PREPARE_LOCK_FILENAME
    for _ in range(10):  # bounded: each retry means another run finished in between
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise PrepareError(
                f"{root}: another `energon prepare` (pid {holder}) is preparing this dataset "
                f"right now (it holds {path}); wait for it to finish, then run again"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # locked a file that its holder removed on finishing: take the new one
    else:
        raise PrepareError(f"{root}: could not take the prepare lock {path}")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        remove_quietly(path)  # a run that opened it meanwhile sees it gone and retries
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
