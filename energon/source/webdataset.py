"""The WebDataset leaf: one split of one prepared WebDataset, readable by global sample index.

The leaf is a small, picklable description (paths and counts); files are opened lazily in the process
that reads. Reading a sample is: locate its shard (binary search over cumulative counts), read its byte
range through the tar index with one ``pread``, split it into members, decode the wanted parts, build
the sample. Errors name the dataset, shard, sample key and byte offset.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from energon import epath
from energon.errors import (
    DamagedSampleError,
    EmptyDatasetError,
    SampleException,
    SampleReadError,
    TarFormatError,
)
from energon.format.checksums import checksum_rel_path, crc32, read_checksums
from energon.format.info import read_info
from energon.format.layout import (
    DATASET_YAML_FILENAME,
    INDEX_SQLITE_FILENAME,
    INFO_JSON_FILENAME,
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
)
from energon.format.shard_index import ShardCounts, ShardIndex, ShardNames, ShardStarts
from energon.format.shard_table import shards_fingerprint
from energon.format.split_shards import open_split_shards
from energon.format.sqlite_index import sample_key_at
from energon.format.tar import split_member_name, split_sample_bytes
from energon.format.tar_index import TarIndex, tar_index_path
from energon.samples.source_info import make_source_info
from energon.source.dataset_config import SampleBuilder, load_sample_builder
from energon.source.shard_reader import shard_reader


def tar_byte_index(
    shard_path: str, expected_samples: int | None = None, expected_from: str = INFO_JSON_FILENAME
) -> TarIndex:
    """The byte index of a tar shard (``<shard>.tar.idx``; a remote one through its local copy).
    With ``expected_samples`` (what ``expected_from`` records) opening it checks the count."""
    index_path = tar_index_path(shard_path)
    local = epath.local_copy(index_path) if epath.is_remote(shard_path) else index_path
    return TarIndex(
        local, expected_samples=expected_samples, name=index_path, expected_from=expected_from
    )


@dataclasses.dataclass
class WebdatasetLeaf:
    """One split of a prepared WebDataset (a :class:`~energon.source.leaf.LeafDataset`).

    ``shards`` may be lazy (a prepared shard table: only the shards a process touches are read),
    so nothing here goes over all shards but the tools' ``shard_names`` / ``shard_counts``."""

    kind = "webdataset"
    root: str
    split_part: str
    shards: ShardIndex
    builder: SampleBuilder
    excluded: frozenset[int] = frozenset()
    subflavors: dict[str, Any] = dataclasses.field(default_factory=dict)
    checksums: bool = False  # verify every sample against .nv-meta/checksums (prepare --checksums)
    # the files in .nv-meta it was opened from (energon simulate counts what ranks read)
    dataset_config: str = DATASET_YAML_FILENAME
    split_config: str = SPLIT_YAML_FILENAME

    def __post_init__(self) -> None:
        self._paths: dict[int, str] = {}  # shard number -> path, for the shards opened so far
        self._numbers: dict[str, int] = {}  # and back

    @classmethod
    def open(
        cls,
        root: str | os.PathLike,
        *,
        split_part: str,
        split_config: str | None = None,
        dataset_config: str = DATASET_YAML_FILENAME,
        subflavors: dict[str, Any] | None = None,
        builder: SampleBuilder | None = None,
    ) -> WebdatasetLeaf:
        """Describe the split ``split_part``: from the prepared shard table when it matches the
        dataset (reads only what is asked for later), else from ``.info.json`` and the split
        config (:func:`energon.source.shards.open_split_shards`)."""
        root = epath.normalize(root)
        if builder is None:
            builder = load_sample_builder(root, dataset_config)
        split_config = split_config or builder.split_config or SPLIT_YAML_FILENAME
        split = open_split_shards(root, split_part, split_config)
        if split.shards.num_shards == 0 or split.shards.samples == 0:
            raise EmptyDatasetError(f"{root}: split {split_part!r} has no samples")
        return cls(
            root=root,
            split_part=split_part,
            shards=split.shards,
            builder=builder,
            excluded=split.excluded,
            subflavors={**builder.subflavors, **(subflavors or {})},
            checksums=split.checksums,
            dataset_config=dataset_config,
            split_config=split_config,
        )

    def __len__(self) -> int:
        return self.shards.samples

    @property
    def shard_starts(self) -> Sequence[int]:
        """First sample of each shard (lazy: the plan reads only those inside a stream's range)."""
        return ShardStarts(self.shards)

    @property
    def shard_names(self) -> Sequence[str]:
        return ShardNames(self.shards)

    @property
    def shard_counts(self) -> Sequence[int]:
        return ShardCounts(self.shards)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, index inside the shard) of a global sample index."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {index} out of range [0, {len(self)}) in {self.root}")
        shard = self.shards.shard_of(index)
        return shard, index - self.shards.start(shard)

    def sample_location(self, index: int) -> dict[str, Any]:
        """Where sample ``index`` lies, for error reports: its shard and the byte offset of its
        first tar header."""
        shard, inner = self.locate(index)
        start, _ = shard_reader().byte_range(self.shard_path(shard), inner, tar_byte_index)
        return {"shard": self.shards.name(shard), "offset": start}

    def shard_path(self, shard: int) -> str:
        path = self._paths.get(shard)
        if path is None:
            path = self._paths[shard] = epath.join(self.root, self.shards.name(shard))
            self._numbers[path] = shard
        return path

    @property
    def remote(self) -> bool:
        """Shards live in object storage (reads benefit from :meth:`prefetch` hints)."""
        return epath.is_remote(self.root)

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that samples ``[first, end)`` will be read soon (``later``: after the ranges hinted
        without it); remote shards fetch them on background threads (:mod:`energon.source.prefetch`)."""
        reader = shard_reader()
        while first < end:
            shard, inner = self.locate(first)
            count = min(end, self.shards.start(shard + 1)) - first
            reader.prefetch(self.shard_path(shard), inner, inner + count, self._index, later)
            first += count

    def _index(self, shard_path: str) -> TarIndex:
        """The shard's tar index, checked against the sample count of ``.info.json`` on opening,
        with the shard's sample checksums when the dataset has them."""
        shard = self._numbers[shard_path]
        count = self.shards.start(shard + 1) - self.shards.start(shard)
        info = epath.join(self.root, MAIN_FOLDER_NAME, INFO_JSON_FILENAME)
        index = tar_byte_index(shard_path, count, info)
        if self.checksums:
            url = epath.join(self.root, checksum_rel_path(self.shards.name(shard)))
            local = epath.local_copy(url) if self.remote and epath.is_file(url) else url
            index.checksums = read_checksums(local, url, index.offsets)
        return index

    def read_members(self, index: int) -> tuple[list[tuple[str, memoryview]], int, int]:
        """(members, shard number, byte offset) of one sample: one pread through the tar index.

        Bytes that are not what ``prepare`` indexed (a truncated shard, a damaged header) are a
        :class:`DamagedSampleError` naming the shard, the sample and the offset: the error policy
        skips and counts that sample, and the rest of the shard still loads.
        """
        shard, inner = self.locate(index)
        path = self.shard_path(shard)
        reader = shard_reader()
        byte_index = reader.index(path, self._index)
        start, end = byte_index.byte_range(inner)
        try:
            data = reader.read(path, start, end)
            if byte_index.checksums is not None:
                _verify(data, int(byte_index.checksums[inner]), path, start)
            members = split_sample_bytes(data, base_offset=start, path=path)
        except DamagedSampleError as e:
            key = e.key or self._key_from_index(shard, inner)
            raise type(e)(e.path, e.offset, f"{e.message} (index {index})", key) from None
        except TarFormatError as e:
            key = self._key_from_index(shard, inner)
            raise DamagedSampleError(path, e.offset, f"{e.message} (index {index})", key) from e
        except ValueError as e:  # a damaged PAX record or name inside a checksum-valid header
            key = self._key_from_index(shard, inner)
            raise DamagedSampleError(path, start, f"damaged tar data: {e}", key) from e
        if not members:
            raise DamagedSampleError(path, start, f"sample {inner} has no file members")
        return members, shard, start

    def _key_from_index(self, shard: int, inner: int) -> str | None:
        """The key ``index.sqlite`` records for a sample whose bytes are damaged (best effort; on
        the error path only, and only for local datasets)."""
        if self.remote:
            return None
        tar_file_id = self.shards.tar_file_id(shard)
        try:
            if tar_file_id is None:
                tar_file_id = list(read_info(self.root)).index(self.shards.name(shard))
            sqlite_path = epath.join(self.root, MAIN_FOLDER_NAME, INDEX_SQLITE_FILENAME)
            return sample_key_at(sqlite_path, tar_file_id, inner)
        except (OSError, ValueError, sqlite3.Error):
            return None

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        """Read, decode and build sample ``index``."""
        members, shard, offset = self.read_members(index)
        shard_name = self.shards.name(shard)
        key = None
        try:
            key, parts = self._decode_parts(members, decoder)
            base = {
                "__key__": key,
                "__restore_key__": restore_key,
                "__subflavors__": dict(self.subflavors),
                "__sources__": (
                    make_source_info(
                        self.root, index, shard_name, tuple([name for name, _ in members])
                    ),
                ),
            }
            return self.builder.build(parts, base, shard_name)
        except Exception as e:
            key = key if key is not None else _first_key(members)
            where = (
                f"{self.shard_path(shard)} sample {key!r} (index {index}) at byte offset {offset}"
            )
            if isinstance(e, SampleException):
                raise SampleReadError(f"{where}: {e}") from e
            raise SampleReadError(f"{where}: {type(e).__name__}: {e}") from e

    def _decode_parts(
        self, members: list[tuple[str, memoryview]], decoder: Any
    ) -> tuple[str, dict[str, Any]]:
        """(sample key, decoded wanted parts); all members must belong to one sample."""
        parts: dict[str, Any] = {}
        key = None
        wants = self.builder.wants_part
        for name, payload in members:
            split = split_member_name(name)
            if split is None:
                continue
            member_key, part = split
            if key is None:
                key = member_key
            elif member_key != key:
                raise SampleReadError(
                    f"members of two samples ({key!r}, {member_key!r}) in one index entry: the "
                    "tar index does not match the shard; re-run `energon prepare`"
                )
            if wants(part):
                raw = bytes(payload)
                parts[part] = (
                    decoder.decode_part(
                        part,
                        raw,
                        key=key,
                        dataset=self.root,
                        dataset_allows_pickle=self.builder.allow_pickle,
                    )
                    if decoder is not None
                    else raw
                )
        if key is None:
            raise SampleReadError("no sample members with a key")
        return key, parts

    def fingerprint(self) -> dict[str, Any]:
        return {
            "path": self.root,
            "split_part": self.split_part,
            "shards": shards_fingerprint(
                self.shards.num_shards, self.shards.samples, self.shards.digest
            ),
        }

    def config(self) -> dict[str, Any]:
        return {
            **self.fingerprint(),
            "sample": self.builder.config(),
            "excluded": len(self.excluded),
            "checksums": self.checksums,
        }


def _verify(data: bytes, expected: int, path: str, offset: int) -> None:
    found = crc32(data)
    if found != expected:
        raise DamagedSampleError(
            path,
            offset,
            f"checksum mismatch (CRC-32 {found:08x}, prepared {expected:08x}): the bytes changed "
            "since the dataset was prepared",
        )


def _first_key(members: list[tuple[str, memoryview]]) -> str | None:
    for name, _ in members:
        split = split_member_name(name)
        if split is not None:
            return split[0]
    return None
