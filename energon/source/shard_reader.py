"""Random access to byte ranges of data files: pread locally, ranged GETs (with prefetched
chunks) remotely.

The reader knows no file format. A leaf hands it, with each call, an opener of the file's byte
index (:class:`ByteIndex`: where each record starts); the reader opens it once and keeps it.
Open file descriptors and byte indices are cached per process with a small LRU, so a worker that
reads from many shards keeps a bounded number of files open. Nothing here is pickled: a reader is
created lazily in each worker process.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import numpy as np

from energon import epath
from energon.errors import TruncatedShardError
from energon.source.prefetch import RemoteChunkCache


class ByteIndex(Protocol):
    """Record boundaries of one file (a tar shard's samples, a JSONL file's lines)."""

    @property
    def offsets(self) -> np.ndarray:
        """Start of every record plus the end of the last one."""
        ...

    def byte_range(self, i: int) -> tuple[int, int]:
        """(start, end) of record ``i``."""
        ...


IndexOpener = Callable[[str], ByteIndex]  # file path -> its byte index


class RecordOffsets:
    """A :class:`ByteIndex` over an array of record offsets (plus the final end)."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets

    def byte_range(self, i: int) -> tuple[int, int]:
        start, end = self.offsets[i : i + 2].tolist()
        return start, end


class _Lru(OrderedDict):
    def __init__(self, capacity: int, close) -> None:
        super().__init__()
        self.capacity = capacity
        self.close = close

    def get_or_open(self, key, opener):
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
            return value
        value = opener(key)
        self[key] = value
        if len(self) > self.capacity:
            _, old = self.popitem(last=False)
            self.close(old)
        return value


def _open_sized(path: str) -> tuple[int, int]:
    """(descriptor, size) of a local file; a missing file is a damaged sample, not a crash."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise TruncatedShardError(path, 0, "the file does not exist (any more)") from None
    return fd, os.fstat(fd).st_size


def _close_sized(entry: tuple[int, int]) -> None:
    os.close(entry[0])


_forks = 0  # forks this process descends from (os.register_at_fork below)


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


class ShardReader:
    """Reads byte ranges of data files (local: pread; remote: ranged GETs of prefetched or
    on-demand chunks, see :mod:`energon.source.prefetch`); one per process."""

    def __init__(self, max_open: int = 64) -> None:
        self._fds = _Lru(max_open, _close_sized)
        self._indices = _Lru(max_open, lambda index: None)
        self._remote = RemoteChunkCache()
        self._forks = _forks

    def _check_fork(self) -> None:
        """After a fork the child starts over: pread shares no file offset, but the remote
        cache's threads did not survive, and a clean slate is the safe choice for the rest.
        Two calls per sample read: a counter compare, not a ``getpid`` system call."""
        if self._forks != _forks:
            self._fds = _Lru(self._fds.capacity, _close_sized)
            self._indices = _Lru(self._indices.capacity, lambda index: None)
            self._remote = RemoteChunkCache()
            self._forks = _forks

    def byte_range(self, path: str, record: int, open_index: IndexOpener) -> tuple[int, int]:
        """(start, end) of record ``record`` of ``path``, from its byte index."""
        return self.index(path, open_index).byte_range(record)

    def index(self, path: str, open_index: IndexOpener) -> ByteIndex:
        """The byte index of ``path`` (opened once per process, kept in a small LRU)."""
        self._check_fork()
        return self._indices.get_or_open(path, open_index)

    def read(self, path: str, start: int, end: int, open_index: IndexOpener | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path``. For a remote file, ``open_index`` lets a read that
        was not prefetched fetch whole records ahead; without it the read fetches exactly its
        range (files read at random places, such as token files)."""
        self._check_fork()
        if epath.is_remote(path):
            return self._read_remote(path, start, end, open_index)
        fd, size = self._fds.get_or_open(path, _open_sized)
        if not 0 <= start <= end <= size:
            raise TruncatedShardError(
                path,
                start,
                f"bytes {start}..{end} were indexed, but the file has {size} bytes (the file "
                "is truncated or changed since it was prepared)",
            )
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise TruncatedShardError(
                path,
                start,
                f"short read: wanted {end - start} bytes, got {len(data)} (the file is "
                "truncated or changed since it was prepared)",
            )
        return data

    def _read_remote(
        self, path: str, start: int, end: int, open_index: IndexOpener | None
    ) -> bytes:
        offsets = None
        if open_index is not None:
            offsets = self._indices.get_or_open(path, open_index).offsets
        return self._remote.read(path, start, end, offsets)

    def prefetch(
        self, path: str, first: int, end: int, open_index: IndexOpener, later: bool = False
    ) -> None:
        """Hint that records ``[first, end)`` of a remote file will be read soon (no-op locally);
        ``later``: after what was hinted without it."""
        if not epath.is_remote(path):
            return
        self._check_fork()
        index = self._indices.get(path)
        if index is not None:
            self._remote.prefetch(path, index.offsets[first : end + 1], later)
            return
        remote = self._remote

        def hint_after_fetching_the_index() -> None:  # on a fetch thread: indices in parallel
            remote.prefetch(path, open_index(path).offsets[first : end + 1], later)

        remote.defer(hint_after_fetching_the_index)

    def prefetch_bytes(self, path: str, start: int, end: int, later: bool = False) -> None:
        """Hint one byte range of a remote file (records that are not consecutive, such as the
        pieces of a token window)."""
        if epath.is_remote(path):
            self._check_fork()
            self._remote.prefetch(path, np.array([start, end], dtype=np.int64), later)


_reader: ShardReader | None = None


def shard_reader() -> ShardReader:
    """The process-wide reader (created on first use, after any fork)."""
    global _reader
    if _reader is None:
        _reader = ShardReader()
    return _reader


def reset_shard_reader() -> None:
    """Forget open files, indices and cached remote chunks (e.g. after data changed in place)."""
    global _reader
    _reader = None


def cumulative_starts(counts: list[int]) -> np.ndarray:
    """Start offset of each shard in the concatenated index space, plus the total at the end."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
