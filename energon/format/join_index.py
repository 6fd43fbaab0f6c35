"""Join indices: which sample of each member dataset makes up each row of a ``join`` (their
file layout, name and builder; ``energon prepare mix.yaml`` runs the builder for every join:
:func:`energon.prepare.join_indices.prepare_metadataset`).

``energon prepare mix.yaml`` writes, for every ``join`` of every split, the file
``<mix>.yaml.cache/join_index_<sha256>.bin`` in the reference's ``JIDX0001`` layout: 8 magic bytes,
an int64 column count, then one row per joined sample of int64 ``(shard, byte offset, byte size)``
triples, one per member (``-1, -1, -1`` for a missing secondary with ``nonmatch: none``). A member
may be a WebDataset or a prepared Parquet/Arrow dataset; for a Parquet member the triple is
``(file, row in the file, row group in the file)`` (``shard`` and ``file`` both number the
member's split list). Unlike the reference, the file name also depends on each member's split and
on sorted excludes, so the same join in two splits gets two indices and every process computes the
same name. Reading joined samples is :mod:`energon.source.join`'s job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import struct
from typing import Any

import numpy as np

from energon import atomic
from energon.errors import DatasetNotPreparedError, MetadatasetError
from energon.format.info import read_info
from energon.format.layout import (
    INDEX_UUID_FILENAME,
    nv_meta_dir,
)
from energon.format.parquet import (
    ROWS,
    key_column_of,
    read_parquet_index,
    row_keys,
)
from energon.format.sqlite_index import read_index_uuid, sample_tables_path

MAGIC = b"JIDX0001"
HEADER_SIZE = len(MAGIC) + 8  # magic, then the int64 column count


@dataclasses.dataclass
class JoinMemberSplit:
    """A join member resolved to its dataset, split and shards."""

    root: str
    split_part: str
    shards: list[str]  # the split's shard list (brace-expanded, excludes not removed)
    excluded_shards: set[str]
    excluded_keys: set[tuple[str, str]]
    nonmatch: str
    dataset_config: str
    split_config: str
    name: str | None
    kind: str = "webdataset"  # or "parquet" (a prepared Parquet/Arrow dataset)


def join_index_name(members: list[JoinMemberSplit]) -> str:
    """The index's file name: a hash of every member's index uuid, split, excludes and nonmatch."""
    digest = hashlib.sha256()
    for m in members:
        try:
            uuid = read_index_uuid(m.root)
        except FileNotFoundError:
            raise DatasetNotPreparedError(
                f"{nv_meta_dir(m.root) / INDEX_UUID_FILENAME} is missing: re-prepare it (`energon prepare "
                f"--tar-index-only {m.root}` is enough)"
            ) from None
        digest.update(b"\0uuid=" + uuid.encode())
        digest.update(b"\0split=" + m.split_part.encode())
        digest.update(b"\0excludes=")
        for shard in sorted(m.excluded_shards):
            digest.update(shard.encode() + b"\0")
        for shard, key in sorted(m.excluded_keys):
            digest.update(f"{shard}/{key}".encode() + b"\0")
        digest.update(f"\0nonmatch={m.nonmatch}\0".encode())
    return f"join_index_{digest.hexdigest()}.bin"


def cache_dir(mds_path: str) -> str:
    """``<mix>.yaml.cache``: where the join indices of the metadataset ``mds_path`` live."""
    return os.path.join(os.path.dirname(mds_path), os.path.basename(mds_path) + ".cache")


def read_join_rows(index_path: str, columns: int) -> np.ndarray:
    """The index as a memory-mapped ``[rows, columns, 3]`` int64 array (header checked)."""
    if not os.path.exists(index_path):
        raise FileNotFoundError(
            f"join index {index_path} not found (or out of date): run `energon prepare "
            "<metadataset.yaml>` to build it"
        )
    with open(index_path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise MetadatasetError(f"{index_path}: not a JIDX0001 join index")
        (found,) = struct.unpack("<q", f.read(8))
    if found != columns:
        raise MetadatasetError(f"{index_path}: has {found} columns, the join has {columns}")
    data = np.memmap(index_path, dtype="<i8", mode="r", offset=HEADER_SIZE)
    if not len(data):
        return np.zeros((0, columns, 3), dtype=np.int64)
    return data.reshape(-1, columns, 3)


def build_join_index(members: list[JoinMemberSplit], target: str) -> tuple[int, int]:
    """Write the join index; returns (rows, primary samples). Errors on unmatched ``error`` members."""
    tables = [_member_samples(m) for m in members]
    primary = tables[0]
    columns = [np.stack([primary["shard"], primary["offset"], primary["size"]], axis=1)]
    keep = np.ones(len(primary["key"]), dtype=bool)
    for m, table in zip(members[1:], tables[1:]):
        lookup = {key: i for i, key in enumerate(table["key"])}
        rows = np.full((len(primary["key"]), 3), -1, dtype=np.int64)
        for i, key in enumerate(primary["key"]):
            j = lookup.get(key)
            if j is None:
                if m.nonmatch == "error":
                    raise MetadatasetError(
                        f"join: sample {key!r} of {members[0].root} has no match in {m.root} "
                        f"(split {m.split_part}); use nonmatch: skip or none"
                    )
                if m.nonmatch == "skip":
                    keep[i] = False
                continue
            rows[i] = (table["shard"][j], table["offset"][j], table["size"][j])
        columns.append(rows)
    data = np.concatenate(columns, axis=1)[keep]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with atomic.replacing(target) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<q", len(members)))
        f.write(np.ascontiguousarray(data, dtype="<i8").tobytes())
    return int(keep.sum()), len(keep)


def _member_samples(m: JoinMemberSplit) -> dict[str, Any]:
    """Keys and ``(shard, offset, size)`` of the member's samples (excludes removed), in split
    order; keys must be unique."""
    table = _parquet_member_rows(m) if m.kind == "parquet" else _tar_member_samples(m)
    if len(set(table["key"])) != len(table["key"]):
        raise MetadatasetError(
            f"join member {m.root}: sample keys are not unique in split {m.split_part}"
        )
    return table


def _parquet_member_rows(m: JoinMemberSplit) -> dict[str, Any]:
    """Rows of a Parquet member's split as ``(file, row, row group)`` with their keys (the key
    column's values, else ``<file>/<row>``; only the key column is read)."""
    index = read_parquet_index(m.root)
    by_name = {f["name"]: i for i, f in enumerate(index.files)}
    starts, groups = index.group_starts, index.table()
    key_column = key_column_of(m.root, m.dataset_config)
    keys: list[str] = []
    where: list[np.ndarray] = []
    for position, name in enumerate(m.shards):
        if name in m.excluded_shards:
            continue
        if name not in by_name:
            raise DatasetNotPreparedError(
                f"join member {m.root}: split {m.split_part!r} lists {name}, which was not "
                f"prepared (run `energon prepare {m.root}`)"
            )
        file = by_name[name]
        rows = int(index.files[file]["rows"])
        path = os.path.join(m.root, name)
        file_keys = row_keys(path, index.files[file]["format"], name, rows, key_column)
        file_groups = groups[starts[file] : starts[file + 1]]
        group_of_row = np.repeat(np.arange(len(file_groups)), file_groups[:, ROWS])
        kept = [
            row
            for row in range(rows)
            if (name, file_keys[row] if key_column else str(row)) not in m.excluded_keys
        ]
        keys.extend(file_keys[row] for row in kept)
        kept_rows = np.asarray(kept, dtype=np.int64)
        where.append(
            np.stack([np.full(len(kept), position), kept_rows, group_of_row[kept_rows]], axis=1)
        )
    table = np.concatenate(where) if where else np.zeros((0, 3), dtype=np.int64)
    return {"key": keys, "shard": table[:, 0], "offset": table[:, 1], "size": table[:, 2]}


def _tar_member_samples(m: JoinMemberSplit) -> dict[str, Any]:
    """Samples of a WebDataset member's split (excludes removed) in split order, from its sqlite
    index."""
    tar_ids = {name: i for i, name in enumerate(read_info(m.root))}
    position = {
        tar_ids[s]: i for i, s in enumerate(m.shards) if s in tar_ids and s not in m.excluded_shards
    }
    path = sample_tables_path(str(m.root), "a join (matching samples by key)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples"
        ).fetchall()
    finally:
        db.close()
    rows = [
        r
        for r in rows
        if r[0] in position and (m.shards[position[r[0]]], r[1]) not in m.excluded_keys
    ]
    rows.sort(key=lambda r: (position[r[0]], r[2]))
    return {
        "key": [r[1] for r in rows],
        "shard": np.array([position[r[0]] for r in rows], dtype=np.int64),
        "offset": np.array([r[3] for r in rows], dtype=np.int64),
        "size": np.array([r[4] for r in rows], dtype=np.int64),
    }
