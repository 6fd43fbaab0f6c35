"""``megatron.energon.flavors.webdataset.itar``: indexed tar files. ``<shard>.tar.idx`` holds the
byte offset of every sample (and the end); :mod:`energon.format.tar_index` reads and writes it,
this module gives the reference's reader/writer classes, pointers and random-access tar file."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, BinaryIO

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.retry_stream import RetryReadStream
from energon.format.tar_index import TarIndex, encode_offsets, tar_index_path
from energon.samples.edataclass import edataclass

__all__ = [
    "ITAR_SUFFIX",
    "CacheEntry",
    "CachedItarOffsetReader",
    "EPath",
    "ITarFile",
    "ITarRawSamplePartPointer",
    "ITarSamplePointer",
    "RetryReadStream",
    "SubFileReader",
    "TarIndexReader",
    "TarIndexWriter",
    "edataclass",
    "get_itar_byte_offset",
    "open_itar",
]

ITAR_SUFFIX = ".tar.idx"


def _index_file(tar_path: Any) -> str:
    return os.fspath(tar_index_path(epath.normalize(os.fspath(tar_path))))


@edataclass
class ITarSamplePointer:
    """A sample in a tar file (``tar_file_id``: index into the reader's shard list)."""

    tar_file_id: int
    byte_offset: int
    byte_size: int


@edataclass
class ITarRawSamplePartPointer:
    """The raw content of one part of a sample in a tar file."""

    tar_file_id: int
    raw_byte_offset: int
    raw_byte_size: int


class TarIndexReader:
    """The sample offsets of a shard's ``.tar.idx`` (``len`` samples + 1 entries, memory-mapped)."""

    def __init__(self, tar_path: EPath | str) -> None:
        local = epath.local_copy(_index_file(tar_path))
        self._index = TarIndex(local, name=_index_file(tar_path))

    def __len__(self) -> int:
        return len(self._index.offsets)

    def __getitem__(self, index: int) -> int:
        offsets = self._index.offsets
        if not -len(offsets) <= index < len(offsets):
            raise IndexError(f"Index {index} out of range")
        return int(offsets[index])

    def __iter__(self) -> Iterator[int]:
        return (int(x) for x in self._index.offsets)

    def close(self) -> None:
        self._index = TarIndex(self._index.index_path, name=self._index.name)


class TarIndexWriter:
    """Collects sample offsets; ``close()`` writes ``<shard>.tar.idx`` (atomically)."""

    def __init__(self, tar_path: EPath) -> None:
        self.index_path = _index_file(tar_path)
        self.offsets: list[int] = []

    def append(self, offset: int) -> None:
        self.offsets.append(int(offset))

    def close(self, finalize: bool = True) -> None:
        if finalize:
            epath.write_bytes(self.index_path, encode_offsets(self.offsets))
        self.offsets = []


def get_itar_byte_offset(path: str | EPath, sample_offset: int = 0) -> int:
    """The byte offset of sample ``sample_offset`` of the shard ``path``."""
    return TarIndexReader(path)[sample_offset]


@edataclass
class CacheEntry:
    tar_index_reader: TarIndexReader
    lookahead_offset: int | None = None
    lookahead_byteoffset: int | None = None


class CachedItarOffsetReader:
    """Byte ranges of samples, with the index readers of the ``cache_size`` most recently used
    shards kept open."""

    def __init__(self, cache_size: int = 32) -> None:
        self.cache_size = cache_size
        self.tar_index_reader_cache: OrderedDict[str, CacheEntry] = OrderedDict()

    def get_itar_byte_offset(
        self, tar_file: str | EPath, sample_offset: int = 0
    ) -> tuple[int, int]:
        """(byte offset, byte size) of sample ``sample_offset`` of ``tar_file``."""
        key = os.fspath(tar_file)
        entry = self.tar_index_reader_cache.pop(key, None)
        if entry is None:
            entry = CacheEntry(tar_index_reader=TarIndexReader(tar_file))
        self.tar_index_reader_cache[key] = entry
        while len(self.tar_index_reader_cache) > self.cache_size:
            self.tar_index_reader_cache.popitem(last=False)
        reader = entry.tar_index_reader
        start = reader[sample_offset]
        return start, reader[sample_offset + 1] - start


class SubFileReader(io.RawIOBase):
    """The ``size`` bytes of ``stream`` starting at ``offset``, as a file."""

    def __init__(self, stream: BinaryIO, offset: int, size: int) -> None:
        super().__init__()
        self.stream = stream
        self.offset = offset
        self.size = size
        self.position = 0

    def read(self, n: int = -1) -> bytes:
        left = self.size - self.position
        n = left if n is None or n < 0 else min(n, left)
        self.stream.seek(self.offset + self.position)
        data = self.stream.read(n)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, min(self.size, base + offset))
        return self.position

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        super().close()

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False


class ITarFile(tarfile.TarFile):
    """A ``tarfile.TarFile`` with random access: set ``offset`` to a member's header offset, then
    ``next()`` reads that member."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offset_after_open = self.offset

    def next(self) -> tarfile.TarInfo | None:
        moved = self.offset != getattr(self, "_offset_after_open", self.offset)
        if self.firstmember is not None and moved:
            self.firstmember = None  # the caller jumped: read at the new offset
        return super().next()


@contextlib.contextmanager
def open_itar(
    path: str | EPath, byte_offset: int = 0, byte_size: int | None = None
) -> Iterator[ITarFile]:
    """The tar file ``path`` (or the range of it from ``byte_offset``) opened for reading."""
    name = epath.normalize(os.fspath(path))
    local = epath.local_copy(name)
    with open(local, "rb") as f:
        size = os.path.getsize(local) - byte_offset if byte_size is None else byte_size
        with ITarFile.open(fileobj=SubFileReader(f, byte_offset, size), mode="r:") as tar:
            yield tar
