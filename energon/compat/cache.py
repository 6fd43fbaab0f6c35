"""``megatron.energon.cache``: file stores, cache pools and lazy data.

A cache pool hands out ``Lazy`` handles for aux files (``pool.get_lazy(store, name)``) that a cooker
can put into a sample; the data is read when ``lazy.get()`` is called, typically later in the
pipeline (after packing chose the samples). ``FileStoreCachePool`` prefetches the files of handed-out
lazies on background threads into a private temporary folder, so the read at ``get()`` is local.
Pools reach cookers (``@cooker(need_cache=True)``) and ``TaskEncoder.cache`` through
``get_loader(..., cache_pool=pool)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from energon.compat.epathlib import EPath
from energon.compat.fork_hook import ForkMixin
from energon.compat.jsonl.ijsonl_reader import IJsonlReader
from energon.compat.local_copy import ensure_local_copy
from energon.compat.media import MediaMetadataBase
from energon.compat.webdataset.itar_reader import SqliteITarEntryReader
from energon.compat.webdataset.thread_local_sqlite import ThreadLocalSqlite
from energon.format.layout import INDEX_SQLITE_FILENAME, MAIN_FOLDER_NAME
from energon.format.media_metadata import deserialize_media_metadata
from energon.samples import SourceInfo, add_source_info
from energon.samples.edataclass import edataclass
from energon.source.file_store import (
    DecodeFileStore,
    FileStore,
    FileStoreWrapper,
    PrimaryFileStore,
    SystemFileStore,
    WebdatasetFileStore,
    open_file_store,
)

__path__: list[str] = []  # a package for the alias: cache.base/.file_store/.no_cache/... map here

T = TypeVar("T")

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "MAIN_FOLDER_NAME",
    "CacheFileLazy",
    "CachePool",
    "DecodeFileStore",
    "DirectLazy",
    "EPath",
    "FileCacheLazy",
    "FileStore",
    "FileStoreCachePool",
    "FileStoreDecoder",
    "FileStoreWrapper",
    "ForkMixin",
    "IJsonlReader",
    "JsonlFileStore",
    "Lazy",
    "MediaMetadataBase",
    "MockLazy",
    "NoCachePool",
    "PrimaryFileStore",
    "SourceInfo",
    "SqliteITarEntryReader",
    "SystemFileStore",
    "ThreadLocalSqlite",
    "WebdatasetFileStore",
    "aux_file_stores",
    "deserialize_media_metadata",
    "edataclass",
    "ensure_local_copy",
]


class FileStoreDecoder:
    """Decodes one file's bytes by its name (``SampleDecoder`` is one)."""

    def decode(self, fname: str, data: bytes) -> Any:
        raise NotImplementedError


def aux_file_stores(aux: dict[str, Any] | None) -> dict[str, FileStore]:
    """Aux references (strings) opened as stores; stores are kept."""
    return {
        name: open_file_store(ref) if isinstance(ref, str) else ref
        for name, ref in (aux or {}).items()
    }


@dataclasses.dataclass(eq=False, kw_only=True)
class Lazy(Generic[T]):
    """A file of a store, read when ``get()`` is called; equal for the same store and name
    (usable as a dict key, as the reference's lazies)."""

    ds: FileStore | None
    fname: str
    pool: CachePool | None

    def get(self, sample: Any = None) -> T:
        raise NotImplementedError

    def __hash__(self) -> int:
        return hash((id(self.ds), self.fname))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lazy) and other.ds is self.ds and other.fname == self.fname


def _remembered(lazy: Any, sample: Any) -> Any:
    data, source = lazy._data
    if sample is not None and source is not None:
        add_source_info(sample, source)
    return data


@dataclasses.dataclass(eq=False, kw_only=True)
class DirectLazy(Lazy[T]):
    """Reads from the store on the first ``get()`` (and remembers the result)."""

    _data: tuple[Any, Any] | None = None

    def get(self, sample: Any = None) -> T:
        if self._data is None:
            self._data = self.ds[self.fname]
        return _remembered(self, sample)


@dataclasses.dataclass(eq=False, init=False)
class MockLazy(Lazy[T]):
    """A lazy whose data comes from ``get_fn(fname)`` (no store, no pool)."""

    get_fn: Callable[[str], T]

    def __init__(self, fname: str, get_fn: Callable[[str], T]) -> None:
        self.ds = None
        self.fname = fname
        self.pool = None
        self.get_fn = get_fn

    def get(self, sample: Any = None) -> T:
        return self.get_fn(self.fname)

    def __repr__(self) -> str:
        return f"MockLazy(fname={self.fname!r}, get_fn={self.get_fn!r})"


class CachePool:
    """Hands out lazies for files of stores."""

    def get(self, ds: FileStore, fname: str, sample: Any = None) -> Any:
        """The file's data now."""
        return ds.get(fname, sample)

    def get_lazy(self, ds: FileStore, fname: str) -> Lazy:
        raise NotImplementedError

    def to_cache(self, data: T, name: str) -> Lazy[T]:
        """A lazy for data already at hand (kept in memory)."""
        return MockLazy(name, lambda _name: data)

    def close(self) -> None:
        """Release background resources."""


class NoCachePool(CachePool):
    """No caching: lazies read directly from the store."""

    def get_lazy(self, ds: FileStore, fname: str) -> Lazy:
        return DirectLazy(ds=ds, fname=fname, pool=self)


class _Entry:
    """One file being fetched into the cache, shared by every lazy for it."""

    __slots__ = ("future", "path", "refs", "size")

    def __init__(self, path: Path) -> None:
        self.future: Future | None = None
        self.path = path
        self.refs = 0
        self.size = 0


@dataclasses.dataclass(eq=False, kw_only=True)
class FileCacheLazy(Lazy[T]):
    """A lazy whose file is prefetched by a ``FileStoreCachePool`` (lazies of the same file
    share one read and one cache entry)."""

    entry: _Entry
    _data: tuple[Any, Any] | None = None

    def get(self, sample: Any = None) -> T:
        if self._data is None:
            self._data = self.pool._consume(self)  # type: ignore[union-attr]
        return _remembered(self, sample)

    def __del__(self) -> None:
        if self._data is None and self.pool is not None and self.entry is not None:
            try:
                self.pool._release(self.entry)  # type: ignore[union-attr]
            except Exception:
                pass


@dataclasses.dataclass(eq=False, kw_only=True)
class CacheFileLazy(Lazy[T]):
    """Data given to ``FileStoreCachePool.to_cache``: bytes wait in a file of the cache folder,
    other objects in memory (nothing is pickled); each is read once by ``get()``."""

    cache_path: Path
    _data: tuple[Any, Any] | None = None

    def get(self, sample: Any = None) -> T:
        if self._data is None:
            self._data = (self.pool._take_cached(self.cache_path), None)  # type: ignore[union-attr]
        return _remembered(self, sample)


class FileStoreCachePool(CachePool):
    """Prefetches the files of handed-out lazies on ``num_workers`` threads into a private folder
    below ``parent_cache_dir`` (a temporary one by default). ``method="raw"`` caches the bytes and
    decodes on ``get()``; ``"pickle"`` caches the decoded object (in memory here: nothing of it is
    serialised). A file leaves the cache when its last lazy has read it or was dropped. Beyond
    ``max_cache_size_gbytes`` / ``max_cache_count`` files are not prefetched but read on ``get()``."""

    def __init__(
        self,
        *,
        parent_cache_dir: Path | None = None,
        num_workers: int = 8,
        max_cache_size_gbytes: float = 1024,
        max_cache_count: int = 10_000_000,
        method: Literal["raw", "pickle"] = "raw",
    ) -> None:
        if method not in ("raw", "pickle"):
            raise ValueError(f"method must be 'raw' or 'pickle', not {method!r}")
        self.parent_cache_dir = parent_cache_dir
        self.num_workers = num_workers
        self.max_cache_size = int(max_cache_size_gbytes * (1 << 30))
        self.max_cache_count = max_cache_count
        self.method = method
        self._lock = threading.Lock()
        self._start()
        os.register_at_fork(after_in_child=self._start)

    def _start(self) -> None:
        """A fresh folder and thread pool (also in a forked child: threads do not survive fork)."""
        parent = str(self.parent_cache_dir) if self.parent_cache_dir else None
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        self.cache_dir = Path(tempfile.mkdtemp(prefix="cache_", dir=parent))
        self._executor = ThreadPoolExecutor(self.num_workers, thread_name_prefix="energon-cache")
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._memory: dict[Path, Any] = {}
        self._bytes = 0

    def _raw_store(self, ds: FileStore) -> tuple[FileStore, Any]:
        if isinstance(ds, DecodeFileStore):
            return ds.inner, ds.decoder
        return ds, None

    def get_lazy(self, ds: FileStore, fname: str) -> Lazy:
        path = self.cache_dir / (
            hashlib.md5(str(ds.get_path()).encode()).hexdigest()
            + "_"
            + hashlib.md5(fname.encode()).hexdigest()
        )
        with self._lock:
            entry = self._entries.get((str(path), fname))
            if entry is None:
                entry = _Entry(path)
                self._entries[(str(path), fname)] = entry
                if len(self._entries) <= self.max_cache_count and self._bytes < self.max_cache_size:
                    entry.future = self._executor.submit(self._fetch, ds, fname, entry)
            entry.refs += 1
        return FileCacheLazy(ds=ds, fname=fname, pool=self, entry=entry)

    def to_cache(self, data: T, name: str) -> Lazy[T]:
        """A lazy for data at hand: bytes are parked in the cache folder until read."""
        path = (
            self.cache_dir / f"tocache_{hashlib.md5(name.encode()).hexdigest()}_{uuid.uuid4().hex}"
        )
        if isinstance(data, (bytes, bytearray)):
            path.write_bytes(data)
        else:
            with self._lock:
                self._memory[path] = data
        return CacheFileLazy(ds=None, fname=name, pool=self, cache_path=path)

    def _take_cached(self, path: Path) -> Any:
        with self._lock:
            if path in self._memory:
                return self._memory.pop(path)
        data = path.read_bytes()
        path.unlink(missing_ok=True)
        return data

    def _fetch(self, ds: FileStore, fname: str, entry: _Entry) -> Any:
        if self.method == "pickle":
            data, source = ds[fname]
            self._memory[entry.path] = data
            return source
        raw_store, _ = self._raw_store(ds)
        data, source = raw_store[fname]
        data = bytes(data)
        entry.path.write_bytes(data)
        entry.size = len(data)
        with self._lock:
            self._bytes += entry.size
        return source

    def _consume(self, lazy: FileCacheLazy) -> tuple[Any, Any]:
        entry = lazy.entry
        future = entry.future
        if future is None or future.cancel():
            result = lazy.ds[lazy.fname]  # not fetched (yet): read directly
        else:
            source = future.result()
            if self.method == "pickle":
                result = (self._memory[entry.path], source)
            else:
                raw = entry.path.read_bytes()
                _, decoder = self._raw_store(lazy.ds)
                name = lazy.fname
                part = name.rsplit("/", 1)[-1].split(".", 1)[-1] if "." in name else ""
                data = decoder.decode_part(part, raw) if decoder is not None else raw
                result = (data, source)
        self._release(entry)
        return result

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.refs -= 1
            if entry.refs > 0:
                return
            self._entries = {k: e for k, e in self._entries.items() if e is not entry}
            self._memory.pop(entry.path, None)
            self._bytes -= entry.size
        if entry.future is not None and not entry.future.cancel():
            entry.future.add_done_callback(lambda _f: entry.path.unlink(missing_ok=True))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.cache_dir, ignore_errors=True)


class JsonlFileStore(FileStore):
    """The records of an indexed JSONL file by entry name ``"<index>.json"`` (their raw bytes)."""

    def __init__(
        self,
        jsonl_path: Any,
        sample_filter: Callable[[str], bool] | None = None,
        index_cache_size: int = 5,
    ) -> None:
        from energon.source.jsonl import JsonlLeaf

        self.leaf = JsonlLeaf.open(os.fspath(jsonl_path))
        self.sample_filter = sample_filter

    def __getitem__(self, key: str) -> tuple[bytes, SourceInfo]:
        index_text, _, part = key.partition(".")
        if part != "json" or not index_text.isdigit() or int(index_text) >= len(self.leaf):
            raise KeyError(f"{self.leaf.path}: no record {key!r} (entries are '<index>.json')")
        index = int(index_text)
        return self.leaf.read_line(index), SourceInfo(
            dataset_path=self.leaf.path,
            index=index,
            shard_name=os.path.basename(self.leaf.path),
            file_names=(key,),
        )

    def get_path(self) -> str:
        return self.leaf.path
