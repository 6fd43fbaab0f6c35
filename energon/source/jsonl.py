"""Indexed JSONL datasets: one JSON object per line, random access through ``<file>.jsonl.idx``.

The index is the reference's: uint64 little-endian start offsets of every record plus a final entry
equal to the file size. Blank lines belong to the record before them. Samples are crude dicts with the
parsed object under ``json`` (cook them with a task encoder's cookers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any

import numpy as np

from energon import epath
from energon.errors import JsonlFormatError, SampleException
from energon.source.shard_reader import shard_reader


def jsonl_index_path(path: str) -> str:
    return path[: -len(".jsonl")] + ".jsonl.idx" if path.endswith(".jsonl") else path + ".idx"


def prepare_jsonl(path: str | os.PathLike, *, progress: bool = False) -> int:
    """Write ``<file>.jsonl.idx`` (atomically) and return the number of records.

    A remote file is streamed into a temporary local copy once, and the index is uploaded next to
    it (through a temporary object)."""
    path = os.fspath(path)
    if epath.is_remote(path):
        with tempfile.TemporaryDirectory(prefix="energon-jsonl-") as tmp:
            local = os.path.join(tmp, "data.jsonl")
            epath.download(path, local)
            offsets = _record_offsets(local, name=path)
    else:
        offsets = _record_offsets(path, name=path)
    epath.write_bytes(jsonl_index_path(path), np.asarray(offsets, dtype="<u8").tobytes())
    if progress:
        print(f"Done. Found {len(offsets) - 1} samples.")
    return len(offsets) - 1


def _record_offsets(local_path: str, *, name: str) -> list[int]:
    """Start offset of every record plus the file size (blank lines join the record before)."""
    offsets: list[int] = []
    position = 0
    line_number = 0
    with open(local_path, "rb") as f:
        for line in f:
            line_number += 1
            stripped = line.strip()
            if stripped:
                if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
                    raise JsonlFormatError(
                        f"{name}: line {line_number} (byte offset {position}) is not a JSON object"
                    )
                offsets.append(position if offsets else 0)
            position += len(line)
    if not offsets:
        raise JsonlFormatError(f"{name}: no records found")
    offsets.append(position)
    return offsets


@dataclasses.dataclass
class _CrudeBuilder:
    subflavors: dict[str, Any]
    sample_type: Any = None
    kind: str = "crude"


class JsonlLeaf:
    """A whole JSONL file as one leaf (JSONL has no splits: every split part is the whole file)."""

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
            raise FileNotFoundError(f"JSONL file {path} does not exist")
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
        shard_reader().prefetch(self.path, first, min(end, self.count), later)

    def read_line(self, index: int) -> bytes:
        reader = shard_reader()
        start, end = reader.byte_range(self.path, index)
        return reader.read(self.path, start, end)

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        from energon.samples import CrudeSample, SourceInfo

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
            "shards": [[epath.basename(self.path), self.count]],
        }

    def config(self) -> dict[str, Any]:
        return {**self.fingerprint(), "type": "jsonl"}
