"""Indexed JSONL files: ``<file>.jsonl.idx`` next to ``<file>.jsonl``, and preparing it.

The index is the reference's: uint64 little-endian start offsets of every record plus a final entry
equal to the file size. Blank lines belong to the record before them. Reading records is
:mod:`energon.source.jsonl`'s job.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from energon import epath
from energon.errors import JsonlFormatError


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
