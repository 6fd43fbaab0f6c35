"""Names of the files in a prepared dataset, and the helpers every writer uses.

All metadata is written to a temporary file next to its target and then renamed over it, so a
reader (or an interrupted ``prepare``) only ever sees a complete old or a complete new file; and
every writer of a dataset's metadata (``prepare``, ``prepare-media``) holds its prepare lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

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

PathLike = str | os.PathLike


def nv_meta_dir(root: PathLike) -> Path:
    """The ``.nv-meta`` folder of a dataset root."""
    return Path(root) / MAIN_FOLDER_NAME


def temp_name_for(target: PathLike) -> Path:
    """A unique temporary name in the target's folder (same file system, so rename is atomic)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")


def atomic_write_bytes(target: PathLike, data: bytes, *, mode_like: PathLike | None = None) -> None:
    """Write ``data`` to ``target`` through a temporary file and a rename."""
    tmp = temp_name_for(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        copy_permissions(mode_like, tmp)
        os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise


def atomic_write_text(target: PathLike, text: str, *, mode_like: PathLike | None = None) -> None:
    atomic_write_bytes(target, text.encode("utf-8"), mode_like=mode_like)


def copy_permissions(source: PathLike | None, target: PathLike) -> None:
    """Give a generated file its source's permission bits plus owner read/write (best effort).

    Datasets are often shared by a group; the metadata should be as readable as the shards.
    """
    if source is None:
        return
    try:
        os.chmod(target, (os.stat(source).st_mode & 0o777) | 0o600)
    except OSError:
        pass


def remove_quietly(path: PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
