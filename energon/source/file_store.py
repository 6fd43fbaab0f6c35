"""Random access to single files by name: aux data sources for cookers.

``WebdatasetFileStore`` reads ``<sample key>.<part>`` entries of a prepared dataset through its sqlite
index (content byte ranges, one pread each); ``SystemFileStore`` reads files below a folder;
``DecodeFileStore`` decodes what an inner store returns by the file's extension; ``PrimaryFileStore``
resolves names starting with ``.`` against the current sample's key (``.wav`` -> ``<key>.wav``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from energon import epath
from energon.errors import DatasetNotPreparedError, SampleException
from energon.format.info import has_info, read_info
from energon.format.sqlite_index import sample_tables_path
from energon.format.tar import split_member_name
from energon.media import MediaMetadataReader
from energon.samples import SourceInfo, add_source_info
from energon.source.shard_reader import shard_reader
from energon.source.webdataset import tar_byte_index


class FileStore:
    """``store[key] -> (data, SourceInfo)``; ``get(key, sample)`` also records the source."""

    def __getitem__(self, key: str) -> tuple[Any, Any]:
        raise NotImplementedError

    def get(self, key: str, sample: Any = None) -> Any:
        data, source = self[key]
        if sample is not None:
            add_source_info(sample, source)
        return data

    def get_path(self) -> str:
        raise NotImplementedError

    def get_media_metadata(self, key: str) -> Any:
        """Image size / audio-video durations of entry ``key`` from the prepared media metadata
        (``energon prepare --media-metadata-...`` or ``energon prepare-media``), without decoding."""
        readers = self.__dict__.setdefault("_media_readers", {})
        root = self.get_path()
        if root not in readers:
            readers[root] = MediaMetadataReader(root)
        return readers[root].get(key)


class SystemFileStore(FileStore):
    """Files under a folder (local or remote), by relative name."""

    def __init__(self, base_dir: str | None = None) -> None:
        self.base_dir = epath.normalize(base_dir) if base_dir else None

    def _path(self, name: str) -> str:
        """The file ``name`` names, which must lie inside the store's folder: ``..``, absolute
        paths and (for local folders) symbolic links that lead out of it are refused."""
        if self.base_dir is None:
            return name
        if "\0" in name:
            raise SampleException(f"{name!r} is not a valid file name")
        path = epath.resolve(name, self.base_dir)
        if epath.is_remote(self.base_dir):
            if not _inside(path, self.base_dir, "/"):
                raise SampleException(f"{name!r} points outside of {self.base_dir}")
            return path
        if not _inside(path, self.base_dir, os.sep) or not _inside(
            os.path.realpath(path), os.path.realpath(self.base_dir), os.sep
        ):
            raise SampleException(f"{name!r} points outside of {self.base_dir}")
        return path

    def __getitem__(self, name: str) -> tuple[bytes, Any]:
        path = self._path(name)
        try:
            data = epath.read_bytes(path)
        except FileNotFoundError:
            raise SampleException(f"aux file {path} not found") from None
        return data, SourceInfo(
            dataset_path=self.base_dir or "",
            index=name,
            shard_name=self.base_dir or "",
            file_names=(name,),
        )

    def get_path(self) -> str:
        return self.base_dir or ""


def _inside(path: str, root: str, separator: str) -> bool:
    return path.startswith(root.rstrip(separator) + separator)


class WebdatasetFileStore(FileStore):
    """Entries ``<sample key>.<part>`` of a prepared dataset (any split)."""

    def __init__(self, dataset_path: str) -> None:
        self.root = epath.normalize(dataset_path)
        if not has_info(self.root):
            raise DatasetNotPreparedError(f"{self.root}: prepare it with `energon prepare`")
        # remote: a validated copy in the local cache
        db_path = sample_tables_path(self.root, "a file store (samples looked up by key)")
        self._shards = list(read_info(self.root))
        self._db_path = db_path
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_shards": self._shards, "_db_path": self._db_path}

    def get_media_metadata(self, key: str) -> Any:
        return super().get_media_metadata(key)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            db = sqlite3.connect(f"file:{self._db_path}?mode=ro&immutable=1", uri=True)
            self._local.db, self._local.pid = db, os.getpid()
        return db

    def __getitem__(self, name: str) -> tuple[bytes, Any]:
        split = split_member_name(name)
        if split is None:
            raise SampleException(f"{name!r} is not a '<sample key>.<part>' entry name")
        key, part = split
        row = (
            self._db()
            .execute(
                "SELECT p.tar_file_id, p.content_byte_offset, p.content_byte_size FROM samples s "
                "JOIN sample_parts p ON p.tar_file_id = s.tar_file_id AND p.sample_index = s.sample_index "
                "WHERE s.sample_key = ? AND p.part_name = ?",
                (key, part),
            )
            .fetchone()
        )
        if row is None:
            raise SampleException(f"{self.root}: no entry {name!r}")
        shard_id, offset, size = row
        shard = self._shards[shard_id]
        data = shard_reader().read(
            epath.join(self.root, shard), offset, offset + size, tar_byte_index
        )
        return data, SourceInfo(
            dataset_path=self.root, index=name, shard_name=shard, file_names=(name,)
        )

    def get_path(self) -> str:
        return self.root


class FileStoreWrapper(FileStore):
    """A store that serves another store's entries (decoded, or relative to a sample)."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner

    def get_path(self) -> str:
        return self.inner.get_path()


class DecodeFileStore(FileStoreWrapper):
    def __init__(self, inner: FileStore, *, decoder: Any) -> None:
        super().__init__(inner)
        self.decoder = decoder

    def __getitem__(self, name: str) -> tuple[Any, Any]:
        data, source = self.inner[name]
        part = name.rsplit("/", 1)[-1].split(".", 1)[-1] if "." in name else ""
        return self.decoder.decode_part(part, data), source

    def get_media_metadata(self, key: str) -> Any:
        return self.inner.get_media_metadata(key)


class PrimaryFileStore(FileStoreWrapper):
    """The sample's own dataset; names starting with ``.`` are relative to the current key."""

    def __init__(self, inner: FileStore, current_key: str) -> None:
        super().__init__(inner)
        self.current_key = current_key

    def _name(self, name: str) -> str:
        return self.current_key + name if name.startswith(".") else name

    def __getitem__(self, name: str) -> tuple[Any, Any]:
        return self.inner[self._name(name)]

    def get_media_metadata(self, key: str) -> Any:
        return self.inner.get_media_metadata(self._name(key))


FILESYSTEM_PREFIX = "filesystem://"
REMOTE_FILESYSTEM_PREFIX = "filesystem+"  # filesystem+msc://profile/folder, filesystem+s3://...
_SUPPORTED_URLS = ("msc://", "s3://", "file://")


def split_aux_reference(reference: str) -> tuple[str, str]:
    """An aux reference in Megatron-Energon's notation -> (kind, path or URL).

    ``filesystem://folder`` and ``filesystem+<scheme>://...`` are folders of files (kind
    ``"filesystem"``); anything else (a local path, ``msc://...``, ``s3://...``) is a prepared
    dataset read by ``<key>.<part>`` names (kind ``"dataset"``).
    """
    if reference.startswith(FILESYSTEM_PREFIX):
        kind, target = "filesystem", reference[len(FILESYSTEM_PREFIX) :]
    elif reference.startswith(REMOTE_FILESYSTEM_PREFIX) and "://" in reference:
        kind, target = "filesystem", reference[len(REMOTE_FILESYSTEM_PREFIX) :]
    else:
        kind, target = "dataset", reference
    if not target:
        raise ValueError(f"aux reference {reference!r} names no folder or dataset")
    if "://" in target and not target.startswith(_SUPPORTED_URLS):
        scheme = target.partition("://")[0]
        raise ValueError(
            f"aux reference {reference!r}: '{scheme}://' is not a supported storage (use msc://, "
            "s3:// or a local path; filesystem+msc:// for a remote folder)"
        )
    return kind, target


def aux_reference(kind: str, target: str) -> str:
    """The notation of :func:`split_aux_reference` for an already resolved path or URL."""
    if kind == "dataset":
        return target
    return (REMOTE_FILESYSTEM_PREFIX if epath.is_remote(target) else FILESYSTEM_PREFIX) + target


def open_file_store(reference: str) -> FileStore:
    """An aux reference (a folder of files or a prepared dataset, local or remote) as a store."""
    kind, target = split_aux_reference(reference)
    if kind == "filesystem":
        return SystemFileStore(target)
    return WebdatasetFileStore(target)
