"""``megatron.energon.flavors.webdataset.itar_reader``: random access to the samples of tar shards
(by index over a list of shards, by join index row, or by key through ``index.sqlite``), each read
as one byte range and split into its parts (:func:`energon.format.tar.split_sample_bytes`)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator
from itertools import accumulate
from typing import Any, TypeVar

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.webdataset.indexing import JoinIndexReader, SqliteIndexReader
from energon.compat.webdataset.itar import (
    CachedItarOffsetReader,
    ITarFile,
    ITarRawSamplePartPointer,
    ITarSamplePointer,
)
from energon.compat.webdataset.metadata import get_info_shard_files
from energon.compat.webdataset.structs import FilteredSample, ShardInfo
from energon.format.layout import INDEX_SQLITE_FILENAME, MAIN_FOLDER_NAME
from energon.format.tar import split_member_name, split_sample_bytes
from energon.samples.source_info import SourceInfo

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "CachedItarOffsetReader",
    "EPath",
    "FilteredSample",
    "ITarFile",
    "ITarRawSamplePartPointer",
    "ITarReader",
    "ITarSamplePointer",
    "JoinIndexFileITarReader",
    "JoinIndexReader",
    "ShardInfo",
    "ShardInfosITarReader",
    "SourceInfo",
    "SqliteITarEntryReader",
    "SqliteIndexReader",
    "get_info_shard_files",
]

T_index = TypeVar("T_index")


class ITarReader:
    """Samples of the tar files ``tar_filenames`` (paths ``tar_filepaths``) as dicts of their
    parts (``part_filter`` selects parts, ``sample_filter`` keys); subclasses say where sample
    ``index`` lies (:meth:`_pointer`)."""

    def __init__(
        self,
        base_path: EPath,
        tar_filenames: list[str],
        tar_filepaths: list[EPath],
        part_filter: Callable[[str], bool] | None = None,
        itar_cache_size: int = 5,
        sample_filter: Callable[[str], bool] | None = None,
        disable_cache: bool = False,
    ) -> None:
        self.base_path = EPath(base_path)
        self.tar_filenames = list(tar_filenames)
        self.tar_filepaths = [EPath(p) for p in tar_filepaths]
        self.part_filter = part_filter
        self.sample_filter = sample_filter
        self.itar_cache_size = itar_cache_size
        self.disable_cache = disable_cache

    def __len__(self) -> int:
        raise NotImplementedError

    def _pointer(self, index: Any) -> ITarSamplePointer:
        raise NotImplementedError

    def _read(self, pointer: ITarSamplePointer, index: Any) -> FilteredSample | None:
        shard = self.tar_filenames[pointer.tar_file_id]
        path = str(self.tar_filepaths[pointer.tar_file_id])
        data = epath.read_range(path, pointer.byte_offset, pointer.byte_offset + pointer.byte_size)
        sample: dict[str, Any] = {}
        names = []
        for member, payload in split_sample_bytes(data, base_offset=pointer.byte_offset, path=path):
            split = split_member_name(member)
            if split is None:
                continue
            key, part = split
            sample.setdefault("__key__", key)
            if self.part_filter is not None and not self.part_filter(part):
                continue
            names.append(member)
            sample[part] = bytes(payload)
        key = sample.pop("__key__", None)
        if key is None or (self.sample_filter is not None and not self.sample_filter(key)):
            return None
        source = SourceInfo(
            dataset_path=self.base_path, index=index, shard_name=shard, file_names=tuple(names)
        )
        return FilteredSample(
            __key__=key,
            __shard__=shard,
            __restore_key__=("Webdataset", index),
            __sources__=(source,),
            **sample,
        )

    def __getitem__(self, index: Any) -> FilteredSample | None:
        return self._read(self._pointer(index), index)

    def close(self) -> None:
        """Nothing stays open between reads."""


class ShardInfosITarReader(ITarReader):
    """Sample ``i`` of the concatenation of ``shard_infos`` (through the ``.tar.idx`` files)."""

    def __init__(
        self,
        base_path: EPath,
        shard_infos: list[ShardInfo],
        part_filter: Callable[[str], bool] | None = None,
        itar_cache_size: int = 5,
        sample_filter: Callable[[str], bool] | None = None,
        disable_cache: bool = False,
    ) -> None:
        super().__init__(
            base_path,
            [s.name for s in shard_infos],
            [s.path for s in shard_infos],
            part_filter,
            itar_cache_size,
            sample_filter,
            disable_cache,
        )
        self.shard_starts = [0, *accumulate(s.count for s in shard_infos)]
        self.offsets = CachedItarOffsetReader(itar_cache_size)

    def __len__(self) -> int:
        return self.shard_starts[-1]

    def _pointer(self, index: int) -> ITarSamplePointer:
        if not 0 <= index < len(self):
            raise IndexError(f"Index out of bounds: {index}")
        shard = bisect.bisect_right(self.shard_starts, index) - 1
        offset, size = self.offsets.get_itar_byte_offset(
            self.tar_filepaths[shard], index - self.shard_starts[shard]
        )
        return ITarSamplePointer(tar_file_id=shard, byte_offset=offset, byte_size=size)


class JoinIndexFileITarReader(ITarReader):
    """Sample ``i`` is the one that column ``column`` of row ``i`` of a join index points to."""

    def __init__(
        self,
        index_file: EPath,
        column: int,
        tar_filenames: list[str],
        base_path: EPath,
        part_filter: Callable[[str], bool] | None = None,
        itar_cache_size: int = 5,
        sample_filter: Callable[[str], bool] | None = None,
        disable_cache: bool = False,
    ) -> None:
        base = EPath(base_path)
        super().__init__(
            base,
            tar_filenames,
            [base / name for name in tar_filenames],
            part_filter,
            itar_cache_size,
            sample_filter,
            disable_cache,
        )
        self.index = JoinIndexReader(index_file, column=column)

    def __len__(self) -> int:
        return len(self.index)

    def _pointer(self, index: int) -> ITarSamplePointer:
        if not 0 <= index < len(self):
            raise IndexError(f"Index out of bounds: {index}")
        ((shard, offset, size),) = self.index[index]
        return ITarSamplePointer(tar_file_id=shard, byte_offset=offset, byte_size=size)

    def __getitem__(self, index: int) -> FilteredSample | None:
        pointer = self._pointer(index)
        return None if pointer.tar_file_id < 0 else self._read(pointer, index)


class SqliteITarEntryReader(ITarReader):
    """Samples by key through ``.nv-meta/index.sqlite``; with ``key_is_full_entryname`` an entry
    ``"<key>.<part>"`` gives that part's bytes and source."""

    def __init__(
        self,
        base_path: EPath,
        part_filter: Callable[[str], bool] | None = None,
        itar_cache_size: int = 5,
        sample_filter: Callable[[str], bool] | None = None,
        key_is_full_entryname: bool = False,
        disable_cache: bool = False,
    ) -> None:
        base = EPath(base_path)
        names = get_info_shard_files(base)
        super().__init__(
            base,
            names,
            [base / n for n in names],
            part_filter,
            itar_cache_size,
            sample_filter,
            disable_cache,
        )
        self.key_is_full_entryname = key_is_full_entryname
        self.index = SqliteIndexReader(base / MAIN_FOLDER_NAME / INDEX_SQLITE_FILENAME)

    def __len__(self) -> int:
        return self.index.get_sample_count()

    def _pointer(self, key: str) -> ITarSamplePointer:
        return self.index.get_sample_pointer_by_key(key)

    def __getitem__(self, key: str) -> Any:
        if not self.key_is_full_entryname:
            return super().__getitem__(key)
        split = split_member_name(key)
        if split is None:
            raise ValueError(f"Invalid file name: {key}")
        part = self.index.get_sample_part(*split)
        path = str(self.tar_filepaths[part.tar_file_id])
        data = epath.read_range(
            path, part.raw_byte_offset, part.raw_byte_offset + part.raw_byte_size
        )
        return data, SourceInfo(
            dataset_path=self.base_path,
            index=key,
            shard_name=self.tar_filenames[part.tar_file_id],
            file_names=(key,),
        )

    def list_all_samples(self) -> Generator[tuple[str, int, int], None, None]:
        return self.index.list_all_samples()

    def list_all_sample_parts(self) -> Generator[tuple[str, int, int], None, None]:
        return self.index.list_all_sample_parts()

    def list_sample_parts(
        self, sample_key: str, slow_mode: bool = False
    ) -> Generator[tuple[str, int, int], None, None]:
        return self.index.list_sample_parts(sample_key)

    def get_total_size(self) -> int:
        return self.index.get_total_size()

    def close(self) -> None:
        self.index.close()
