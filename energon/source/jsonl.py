"""The JSONL leaf: one indexed JSONL file, one JSON object per record, read by record index.

Records are located through ``<file>.jsonl.idx`` (see :mod:`energon.format.jsonl`, which also
prepares it) and read with one pread or ranged GET each. Samples are crude dicts with the parsed
object under ``json`` (cook them with a task encoder's cookers).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from energon import epath
from energon.errors import DatasetNotFoundError, SampleException
from energon.format.jsonl import JsonlFormatError, jsonl_index_path
from energon.format.shard_table import listed_shards_fingerprint
from energon.samples import CrudeSample, SourceInfo
from energon.source.shard_reader import RecordOffsets, shard_reader


def jsonl_byte_index(path: str) -> RecordOffsets:
    """The record offsets of a JSONL file (a remote index through its local copy)."""
    return RecordOffsets(np.memmap(epath.local_copy(jsonl_index_path(path)), dtype="<u8", mode="r"))


@dataclasses.dataclass
class _CrudeBuilder:
    subflavors: dict[str, Any]
    sample_type: Any = None
    kind: str = "crude"


class JsonlLeaf:
    """A whole JSONL file as one leaf (JSONL has no splits: every split part is the whole file)."""

    kind = "jsonl"

    def __init__(self, path: str, count: int, subflavors: dict[str, Any]) -> None:
        self.root = path
        self.path = path
        self.split_part = ""
        self.count = count
        self.subflavors = subflavors
        self.builder = _CrudeBuilder(subflavors)
        self.excluded: frozenset[int] = frozenset()
        self.shard_starts = [0]

    @classmethod
    def open(cls, path: str, *, subflavors: dict[str, Any] | None = None) -> JsonlLeaf:
        path = epath.normalize(path)
        if not epath.is_file(path):
            raise DatasetNotFoundError(f"JSONL file {path} does not exist")
        index = jsonl_index_path(path)
        if not epath.exists(index):
            raise FileNotFoundError(f"{index} not found: run `energon prepare {path}`")
        size, _ = epath.stat(index)
        if size < 16 or size % 8:
            raise JsonlFormatError(
                f"{index}: damaged index ({size} bytes); run `energon prepare {path}`"
            )
        last = int.from_bytes(epath.read_range(index, size - 8, size), "little")
        if last != epath.stat(path)[0]:
            raise JsonlFormatError(
                f"The index of the jsonl file does not match the file ({path}). Regenerate the "
                f"index with `energon prepare {path}`."
            )
        return cls(path, size // 8 - 1, dict(subflavors or {}))

    def __len__(self) -> int:
        return self.count

    @property
    def remote(self) -> bool:
        """The file lives in object storage (reads benefit from :meth:`prefetch` hints)."""
        return epath.is_remote(self.path)

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that records ``[first, end)`` will be read soon (fetched in the background)."""
        shard_reader().prefetch(self.path, first, min(end, self.count), jsonl_byte_index, later)

    def read_line(self, index: int) -> bytes:
        reader = shard_reader()
        start, end = reader.byte_range(self.path, index, jsonl_byte_index)
        return reader.read(self.path, start, end, jsonl_byte_index)

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        raw = self.read_line(index)
        name = epath.basename(self.path)
        try:
            obj = json.loads(raw)
        except ValueError as e:
            raise SampleException(f"{self.path} record {index}: invalid JSON: {e}") from e
        return CrudeSample(
            __key__=str(index),
            __shard__=name,
            __restore_key__=restore_key,
            __subflavors__=dict(self.subflavors),
            __sources__=(
                SourceInfo(
                    dataset_path=self.path,
                    index=index,
                    shard_name=name,
                    file_names=(f"{index}.json",),
                ),
            ),
            json=obj,
        )

    def fingerprint(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "split_part": "",
            "shards": listed_shards_fingerprint([epath.basename(self.path)], [self.count]),
        }

    def config(self) -> dict[str, Any]:
        return {**self.fingerprint(), "type": "jsonl"}
