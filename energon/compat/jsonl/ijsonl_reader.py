"""``megatron.energon.flavors.jsonl.ijsonl_reader``: random access to the lines of an indexed JSONL
file (entries ``"<line>.json"``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.jsonl.ijsonl import (
    CachedIJsonlOffsetReader,
    IJsonlFile,
    IJsonlIndexReader,
    IJsonlSamplePointer,
)
from energon.compat.webdataset.structs import FilteredSample
from energon.samples.source_info import SourceInfo

__all__ = [
    "CachedIJsonlOffsetReader",
    "EPath",
    "FilteredSample",
    "IJsonlFile",
    "IJsonlIndexReader",
    "IJsonlReader",
    "IJsonlSamplePointer",
    "SourceInfo",
]


class IJsonlReader:
    """Line ``i`` of ``jsonl_path`` as ``(bytes, SourceInfo)`` (key ``"i.json"`` or ``i``)."""

    ijsonl_file: CachedIJsonlOffsetReader | None = None  # set by __init__ (the line offsets)

    def __init__(
        self,
        jsonl_path: EPath,
        sample_filter: Callable[[str], bool] | None = None,
        index_cache_size: int = 5,
    ) -> None:
        self.jsonl_path = epath.normalize(os.fspath(jsonl_path))
        self.sample_filter = sample_filter
        self.ijsonl_file = CachedIJsonlOffsetReader(self.jsonl_path, index_cache_size)

    def __len__(self) -> int:
        return len(self.ijsonl_file.index) - 1

    def _index(self, key: str | int) -> int:
        text = str(key)
        text = text[: -len(".json")] if text.endswith(".json") else text
        if not text.isdigit() or int(text) >= len(self):
            raise KeyError(f"{self.jsonl_path}: no line {key!r}")
        return int(text)

    def __getitem__(self, key: str | int) -> tuple[bytes, SourceInfo]:
        index = self._index(key)
        start, size = self.ijsonl_file.get_ijsonl_byte_offset(index)
        data = epath.read_range(self.jsonl_path, start, start + size)
        return data, SourceInfo(
            dataset_path=self.jsonl_path,
            index=index,
            shard_name=os.path.basename(self.jsonl_path),
            file_names=(f"{index}.json",),
        )

    def _sizes(self) -> Generator[tuple[int, int], None, None]:
        for index in range(len(self)):
            yield index, self.ijsonl_file.get_ijsonl_byte_offset(index)[1]

    def list_all_samples(self) -> Generator[tuple[str, int, int], None, None]:
        """``(key, size, 0)`` of every line."""
        for index, size in self._sizes():
            yield str(index), size, 0

    def list_all_sample_parts(self) -> Generator[tuple[str, int, int], None, None]:
        """``("<key>.json", size, 0)`` of every line."""
        for index, size in self._sizes():
            yield f"{index}.json", size, 0

    def list_sample_parts(self, sample_key: str) -> Generator[tuple[str, int, int], None, None]:
        index = self._index(sample_key)
        yield f"{index}.json", self.ijsonl_file.get_ijsonl_byte_offset(index)[1], 0

    def get_total_size(self) -> int:
        return self.ijsonl_file.get_total_size()

    def close(self) -> None:
        self.ijsonl_file.close()
