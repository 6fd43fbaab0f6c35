"""``megatron.energon.flavors.jsonl.ijsonl``: indexed JSONL files. ``<file>.jsonl.idx`` holds the
byte offset of every line and the file size (:mod:`energon.format.jsonl` writes and reads it)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from energon import epath
from energon.compat.epathlib import EPath
from energon.format.jsonl import jsonl_index_path
from energon.samples.edataclass import edataclass

__all__ = [
    "IJSONL_SUFFIX",
    "CacheEntry",
    "CachedIJsonlOffsetReader",
    "EPath",
    "IJsonlFile",
    "IJsonlIndexReader",
    "IJsonlIndexWriter",
    "IJsonlSamplePointer",
    "edataclass",
]

IJSONL_SUFFIX = ".jsonl.idx"


def _index_file(jsonl_path: EPath | str) -> str:
    return jsonl_index_path(epath.normalize(os.fspath(jsonl_path)))


@edataclass
class IJsonlSamplePointer:
    """Line ``index`` of a JSONL file: its byte range."""

    index: int
    byte_offset: int
    byte_size: int


class IJsonlIndexReader:
    """The offsets of ``<file>.jsonl.idx`` (one per line, plus the file size)."""

    def __init__(self, jsonl_path: EPath | str) -> None:
        data = epath.read_bytes(_index_file(jsonl_path))
        self._offsets = np.frombuffer(data, dtype="<u8")

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, index: int) -> int:
        return int(self._offsets[index])

    def __iter__(self) -> Iterator[int]:
        return (int(x) for x in self._offsets)

    def close(self) -> None:
        self._offsets = self._offsets[:0]

    @staticmethod
    def count_samples(jsonl_path: EPath | str) -> int:
        """Lines of the indexed file, from the index's size."""
        return epath.stat(_index_file(jsonl_path))[0] // 8 - 1

    @staticmethod
    def size(jsonl_path: EPath) -> int:
        """The JSONL file's size (the index's last entry)."""
        index = _index_file(jsonl_path)
        size = epath.stat(index)[0]
        return int.from_bytes(epath.read_range(index, size - 8, size), "little")


class IJsonlIndexWriter:
    """Collects line offsets; ``close()`` writes ``<file>.jsonl.idx``."""

    def __init__(self, jsonl_path: EPath) -> None:
        self.index_path = _index_file(jsonl_path)
        self.offsets: list[int] = []

    def append(self, offset: int) -> None:
        self.offsets.append(int(offset))

    def close(self, finalize: bool = True) -> None:
        if finalize:
            epath.write_bytes(self.index_path, np.asarray(self.offsets, dtype="<u8").tobytes())
        self.offsets = []


@edataclass
class CacheEntry:
    ijsonl_index_reader: IJsonlIndexReader
    lookahead_offset: int | None = None
    lookahead_byteoffset: int | None = None


class CachedIJsonlOffsetReader:
    """Byte ranges of the lines of one JSONL file."""

    def __init__(self, jsonl_file: str | EPath, cache_size: int = 32) -> None:
        self.jsonl_file = jsonl_file
        self.cache_size = cache_size
        self.index = IJsonlIndexReader(jsonl_file)
        self.cache: OrderedDict[int, tuple[int, int]] = OrderedDict()

    def get_ijsonl_byte_offset(self, sample_offset: int = 0) -> tuple[int, int]:
        """(byte offset, byte size) of line ``sample_offset``."""
        start = self.index[sample_offset]
        return start, self.index[sample_offset + 1] - start

    def get_total_size(self) -> int:
        return self.index[len(self.index) - 1]

    def close(self) -> None:
        self.index.close()


class IJsonlFile:
    """Reads lines of an open JSONL file at given offsets."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self.fileobj = fileobj

    def seek(self, offset: int) -> None:
        self.fileobj.seek(offset)

    def next(self, offset: int | None = None, size: int | None = None) -> bytes | None:
        """The line at ``offset`` (default: the current position), or None at the end."""
        if offset is not None:
            self.fileobj.seek(offset)
        data = self.fileobj.read(size) if size is not None else self.fileobj.readline()
        return data or None

    def close(self) -> None:
        self.fileobj.close()

    def __enter__(self) -> IJsonlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
