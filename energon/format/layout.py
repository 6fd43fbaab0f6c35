"""Names of the files in a prepared dataset, and the atomic-write helpers every writer uses.

All metadata is written to a temporary file next to its target and then renamed over it, so a
reader (or an interrupted ``prepare``) only ever sees a complete old or a complete new file.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MAIN_FOLDER_NAME = ".nv-meta"
INFO_JSON_FILENAME = ".info.json"
INFO_YAML_FILENAME = ".info.yaml"
INDEX_SQLITE_FILENAME = "index.sqlite"
INDEX_UUID_FILENAME = "index.uuid"
SPLIT_YAML_FILENAME = "split.yaml"
DATASET_YAML_FILENAME = "dataset.yaml"
SAMPLE_LOADER_FILENAME = "sample_loader.py"
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
