"""Indexed JSONL datasets: one JSON object per line, random access through ``<file>.jsonl.idx``.

The index is the reference's: uint64 little-endian start offsets of every record plus a final entry
equal to the file size. Blank lines belong to the record before them. Samples are crude dicts with the
parsed object under ``json`` (cook them with a task encoder's cookers).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from energon.errors import SampleException


class JsonlFormatError(ValueError):
    """The JSONL file or its index is malformed (names the file and line or offset)."""


def jsonl_index_path(path: str) -> str:
    return path[: -len(".jsonl")] + ".jsonl.idx" if path.endswith(".jsonl") else path + ".idx"


def prepare_jsonl(path: str | os.PathLike, *, progress: bool = False) -> int:
    """Write ``<file>.jsonl.idx`` (atomically) and return the number of records."""
    path = os.fspath(path)
    offsets: list[int] = []
    position = 0
    line_number = 0
    with open(path, "rb") as f:
        for line in f:
            line_number += 1
            stripped = line.strip()
            if stripped:
                if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
                    raise JsonlFormatError(
                        f"{path}: line {line_number} (byte offset {position}) is not a JSON object"
                    )
                offsets.append(position if offsets else 0)
            position += len(line)
    if not offsets:
        raise JsonlFormatError(f"{path}: no records found")
    offsets.append(position)
    index = jsonl_index_path(path)
    tmp = index + ".tmp"
    np.asarray(offsets, dtype="<u8").tofile(tmp)
    os.replace(tmp, index)
    if progress:
        print(f"Done. Found {len(offsets) - 1} samples.")
    return len(offsets) - 1


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
        self._offsets: np.ndarray | None = None
        self._fd: int | None = None
        self._pid = -1

    @classmethod
    def open(cls, path: str, *, subflavors: dict[str, Any] | None = None) -> JsonlLeaf:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"JSONL file {path} does not exist")
        index = jsonl_index_path(path)
        if not os.path.exists(index):
            raise FileNotFoundError(f"{index} not found: run `energon prepare {path}`")
        size = os.path.getsize(index)
        if size < 16 or size % 8:
            raise JsonlFormatError(
                f"{index}: damaged index ({size} bytes); run `energon prepare {path}`"
            )
        with open(index, "rb") as f:
            f.seek(size - 8)
            last = int.from_bytes(f.read(8), "little")
        if last != os.path.getsize(path):
            raise JsonlFormatError(
                f"The index of the jsonl file does not match the file ({path}). Regenerate the "
                f"index with `energon prepare {path}`."
            )
        return cls(path, size // 8 - 1, dict(subflavors or {}))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_offsets=None, _fd=None, _pid=-1)
        return state

    def __len__(self) -> int:
        return self.count

    def _open(self) -> tuple[int, np.ndarray]:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDONLY)
            self._offsets = np.memmap(jsonl_index_path(self.path), dtype="<u8", mode="r")
            self._pid = os.getpid()
        return self._fd, self._offsets  # type: ignore[return-value]

    def read_line(self, index: int) -> bytes:
        fd, offsets = self._open()
        start, end = offsets[index : index + 2].tolist()
        return os.pread(fd, end - start, start)

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        from energon.samples import CrudeSample, SourceInfo

        raw = self.read_line(index)
        name = os.path.basename(self.path)
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
            "shards": [[os.path.basename(self.path), self.count]],
        }

    def config(self) -> dict[str, Any]:
        return {**self.fingerprint(), "type": "jsonl"}
