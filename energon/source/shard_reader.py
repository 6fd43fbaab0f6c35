"""Random access to the byte range of one sample in a tar shard (pread through the tar index).

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


def _open_index(tar_path: str) -> TarIndex:
    """The tar index of a shard; a remote index is read from its local cached copy."""
    index_path = tar_index_path(tar_path)
    return TarIndex(epath.local_copy(index_path) if epath.is_remote(tar_path) else index_path)


READAHEAD_BYTES = int(os.environ.get("ENERGON_REMOTE_READAHEAD_BYTES", 1 << 20))
READAHEAD_BUDGET = int(os.environ.get("ENERGON_REMOTE_READAHEAD_BUDGET", 64 << 20))


class _ReadAhead:
    """Blocks of ``READAHEAD_BYTES`` of remote shards, fetched whole, kept LRU within a byte budget.

    A stream reads each slice's samples in order and slices are contiguous in the shard, so one
    ranged GET of an aligned block serves many samples (of this slice and of neighbouring slices read
    later): one request per block instead of one per sample.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0

    def get(self, path: str, block: int) -> bytes | None:
        data = self._blocks.get((path, block))
        if data is not None:
            self._blocks.move_to_end((path, block))
        return data

    def put(self, path: str, block: int, data: bytes) -> None:
        self._blocks[(path, block)] = data
        self._bytes += len(data)
        while self._bytes > self.budget and len(self._blocks) > 1:
            _, old = self._blocks.popitem(last=False)
            self._bytes -= len(old)


class ShardReader:
    """Reads sample byte ranges of tar shards (local: pread; remote: ranged GET with read-ahead);
    one per process."""

    def __init__(self, max_open: int = 64) -> None:
        self._fds = _Lru(max_open, os.close)
        self._indices = _Lru(max_open, lambda index: None)
        self._readahead = _ReadAhead(READAHEAD_BUDGET)
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        # File offsets are not shared by pread, but be safe and reopen after a fork.
        if os.getpid() != self._pid:
            self._fds = _Lru(self._fds.capacity, os.close)
            self._indices = _Lru(self._indices.capacity, lambda index: None)
            self._readahead = _ReadAhead(READAHEAD_BUDGET)
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
        size = READAHEAD_BYTES
        block = start // size
        if size <= 0 or (end - 1) // size != block:
            return epath.read_range(tar_path, start, end)  # spans blocks: read it directly
        data = self._readahead.get(tar_path, block)
        if data is None:
            index = self._indices.get_or_open(tar_path, _open_index)
            data_end = int(index.offsets[-1])  # end of the last sample: never read past the shard
            block_start = block * size
            data = epath.read_range(
                tar_path, block_start, max(end, min(data_end, block_start + size))
            )
            self._readahead.put(tar_path, block, data)
        offset = start - block * size
        return data[offset : offset + end - start]


_reader: ShardReader | None = None


def shard_reader() -> ShardReader:
    """The process-wide reader (created on first use, after any fork)."""
    global _reader
    if _reader is None:
        _reader = ShardReader()
    return _reader


def cumulative_starts(counts: list[int]) -> np.ndarray:
    """Start offset of each shard in the concatenated index space, plus the total at the end."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64))])
