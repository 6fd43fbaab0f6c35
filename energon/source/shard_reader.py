"""Random access to the byte range of one sample in a tar shard or JSONL file (pread / ranged GET
through the file's byte index).

Open file descriptors and memory-mapped indices are cached per process with a small LRU, so a worker
that reads from many shards keeps a bounded number of files open. Nothing here is pickled: a reader is
created lazily in each worker process.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np

from energon import epath
from energon.format.tar_index import TarIndex, tar_index_path
from energon.source.prefetch import RemoteChunkCache


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


class _Offsets:
    """Record offsets: a ``.jsonl.idx`` (the same uint64 layout as ``.tar.idx``), or the sequence
    starts of a token file. Only used for reads, to cut chunks at record boundaries."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = offsets

    def byte_range(self, i: int) -> tuple[int, int]:
        start, end = self.offsets[i : i + 2].tolist()
        return start, end


def _open_index(path: str) -> TarIndex | _Offsets:
    """The byte index of a shard (``.tar.idx``) or JSONL file (``.jsonl.idx``); a remote index is
    read from its local cached copy."""
    if path.endswith(".bin"):  # a Megatron token file: sequences start at the .idx's pointers
        from energon.megatron.indexed import IndexedTokens

        return _Offsets(IndexedTokens(path[: -len(".bin")]).sequence_pointers)
    if path.endswith(".jsonl"):
        from energon.source.jsonl import jsonl_index_path

        index_path = jsonl_index_path(path)
        return _Offsets(np.memmap(epath.local_copy(index_path), dtype="<u8", mode="r"))
    index_path = tar_index_path(path)
    return TarIndex(epath.local_copy(index_path) if epath.is_remote(path) else index_path)


class ShardReader:
    """Reads sample byte ranges of tar shards (local: pread; remote: ranged GETs of prefetched or
    on-demand chunks, see :mod:`energon.source.prefetch`); one per process."""

    def __init__(self, max_open: int = 64) -> None:
        self._fds = _Lru(max_open, os.close)
        self._indices = _Lru(max_open, lambda index: None)
        self._remote = RemoteChunkCache()
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        # File offsets are not shared by pread, but be safe and reopen after a fork.
        if os.getpid() != self._pid:
            self._fds = _Lru(self._fds.capacity, os.close)
            self._indices = _Lru(self._indices.capacity, lambda index: None)
            self._remote = RemoteChunkCache()
            self._pid = os.getpid()

    def byte_range(self, tar_path: str, sample_in_shard: int) -> tuple[int, int]:
        self._check_fork()
        index = self._indices.get_or_open(tar_path, _open_index)
        return index.byte_range(sample_in_shard)

    def read(self, tar_path: str, start: int, end: int) -> bytes:
        self._check_fork()
        if epath.is_remote(tar_path):
            return self._read_remote(tar_path, start, end)
        fd = self._fds.get_or_open(tar_path, lambda p: os.open(p, os.O_RDONLY))
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise OSError(
                f"{tar_path}: short read at byte offset {start}: wanted {end - start} bytes, got "
                f"{len(data)} (the shard is truncated or changed since it was prepared)"
            )
        return data

    def _read_remote(self, tar_path: str, start: int, end: int) -> bytes:
        index = self._indices.get_or_open(tar_path, _open_index)
        # token files are read at random places: no read-ahead past what was asked for
        readahead = not tar_path.endswith(".bin")
        return self._remote.read(tar_path, start, end, index.offsets, readahead=readahead)

    def prefetch(self, tar_path: str, first: int, end: int, later: bool = False) -> None:
        """Hint that samples ``[first, end)`` of a remote shard will be read soon (no-op locally);
        ``later``: after what was hinted without it."""
        if not epath.is_remote(tar_path):
            return
        self._check_fork()
        index = self._indices.get(tar_path)
        if index is not None:
            self._remote.prefetch(tar_path, index.offsets[first : end + 1], later)
            return
        remote = self._remote

        def hint_after_fetching_the_index() -> None:  # on a fetch thread: indices in parallel
            remote.prefetch(tar_path, _open_index(tar_path).offsets[first : end + 1], later)

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
