"""Reading the ``media_metadata`` / ``media_filters`` tables of ``index.sqlite`` (they are written
by :mod:`energon.format.sqlite_index`, whose writers are re-exported here).

Readers open the database read-only (``?mode=ro``) with one connection per thread (sqlite
connections must not cross threads) and never pickle it: a reader sent to a worker process
reconnects there. Keys are the F14 entry keys: ``<sample key>.<part>`` for WebDatasets, the POSIX
path relative to the folder for plain media folders.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from energon.format.layout import INDEX_SQLITE_FILENAME, PathLike, nv_meta_dir
from energon.format.media_metadata import MediaMetadata, deserialize_media_metadata
from energon.format.sqlite_index import MediaRow, record_media_filter, replace_media_rows
from energon.format.tar import split_member_name

__all__ = [
    "MediaMetadataReader",
    "MediaRow",
    "get_media_metadata",
    "record_media_filter",
    "replace_media_rows",
]

_HOW_TO_PREPARE = (
    "run `energon prepare --media-metadata-by-extension` (or --media-metadata-by-glob / "
    "--media-metadata-by-header) on a WebDataset, or `energon prepare-media "
    "--media-metadata-by-extension PATH` on a prepared dataset or a plain media folder"
)


class MediaMetadataReader:
    """Looks up media metadata of one dataset or folder (``root``)."""

    def __init__(self, root: PathLike) -> None:
        self.root = Path(root)
        self.db_path = nv_meta_dir(self.root) / INDEX_SQLITE_FILENAME
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "db_path": self.db_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.root = state["root"]
        self.db_path = state["db_path"]
        self._local = threading.local()

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
        return db

    def _connect(self) -> sqlite3.Connection:
        if not self.db_path.is_file():
            raise RuntimeError(
                f"{self.root} has no media metadata ({self.db_path} does not exist); "
                f"{_HOW_TO_PREPARE}"
            )
        db = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, check_same_thread=True)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        has_rows = (
            "media_filters" in tables
            and db.execute("SELECT 1 FROM media_filters LIMIT 1").fetchone()
        )
        if "media_metadata" not in tables or not has_rows:
            db.close()
            raise RuntimeError(
                f"{self.root} was prepared without media metadata; {_HOW_TO_PREPARE}"
            )
        db.execute("PRAGMA query_only=ON")
        return db

    def get(self, key: str) -> MediaMetadata:
        """The metadata of entry ``key``; KeyError says whether the file exists at all."""
        db = self._connection()
        row = db.execute(
            "SELECT metadata_type, metadata_json FROM media_metadata WHERE entry_key = ?", (key,)
        ).fetchone()
        if row is not None:
            return deserialize_media_metadata(row[0], row[1])
        if self._entry_exists(db, key):
            raise KeyError(
                f"{key!r} exists in {self.root} but has no media metadata: it did not match the "
                "media filter used at preparation, or it could not be parsed as an image/audio/video"
            )
        raise KeyError(f"{key!r} not found in {self.root}")

    def _entry_exists(self, db: sqlite3.Connection, key: str) -> bool:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "samples" not in tables:  # a plain folder: keys are relative paths
            return (self.root / key).is_file()
        split = split_member_name(key)
        if split is None:
            return False
        row = db.execute(
            "SELECT 1 FROM samples s JOIN sample_parts p ON s.tar_file_id = p.tar_file_id "
            "AND s.sample_index = p.sample_index WHERE s.sample_key = ? AND p.part_name = ? "
            "LIMIT 1",
            split,
        ).fetchone()
        return row is not None

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


@functools.lru_cache(maxsize=64)
def _reader(root: str) -> MediaMetadataReader:
    return MediaMetadataReader(root)


def get_media_metadata(root: PathLike, key: str) -> MediaMetadata:
    """Media metadata of ``key`` in the dataset or media folder at ``root`` (see F103).

    Raises RuntimeError if ``root`` was prepared without media metadata, KeyError if ``key`` has
    none (the message says whether the file exists).
    """
    return _reader(os.path.abspath(os.fspath(root))).get(key)
