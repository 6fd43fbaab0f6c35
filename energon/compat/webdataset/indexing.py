"""``megatron.energon.flavors.webdataset.indexing``: ``index.sqlite`` (the reference's schema, which
energon writes too, :mod:`energon.format.sqlite_index`) and join index files (``JIDX0001``,
:mod:`energon.format.join_index`), with the reference's reader and writer classes."""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any  # noqa: F401 - TYPE_CHECKING: a reference name

import numpy as np
import torch

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.local_copy import ensure_local_copy
from energon.compat.webdataset.itar import ITarRawSamplePartPointer, ITarSamplePointer
from energon.compat.webdataset.structs import ShardInfo
from energon.compat.webdataset.thread_local_sqlite import ThreadLocalSqlite
from energon.errors import DuplicateSampleKeyError
from energon.format.join_index import HEADER_SIZE, MAGIC
from energon.format.sqlite_index import INDEXES, MEDIA_SCHEMA, SAMPLE_SCHEMA
from energon.media.store import record_media_filter, replace_media_rows
from energon.samples.edataclass import edataclass

__all__ = [
    "IndexAggregatable",
    "IndexMediaMetadata",
    "IndexSample",
    "IndexSamplePart",
    "IndexShardInfo",
    "TYPE_CHECKING",
    "DuplicateSampleKeyError",
    "EPath",
    "ITarRawSamplePartPointer",
    "ITarSamplePointer",
    "JoinIndexReader",
    "JoinIndexWriter",
    "SqliteIndexReader",
    "SqliteIndexWriter",
    "ThreadLocalSqlite",
    "ensure_local_copy",
]


class IndexAggregatable:
    """An item a preparation worker sends to the index aggregator."""


@edataclass
class IndexSample(IndexAggregatable):
    """A row of the ``samples`` table."""

    tar_file_id: int
    sample_key: str
    sample_index: int
    byte_offset: int | None
    byte_size: int | None


@edataclass
class IndexSamplePart(IndexAggregatable):
    """A row of the ``sample_parts`` table."""

    tar_file_id: int
    sample_index: int
    part_name: str
    content_byte_offset: int
    content_byte_size: int


@edataclass
class IndexMediaMetadata(IndexAggregatable):
    """A row of the ``media_metadata`` table."""

    entry_key: str
    metadata_type: str
    metadata_json: str


@edataclass
class IndexShardInfo(IndexAggregatable):
    """A scanned shard: its info and the part names found in it."""

    shard_info: ShardInfo
    parts: set[str]


class SqliteIndexWriter:
    """Writes an ``index.sqlite`` row by row (``enable_sample_tables``: the sample tables;
    ``enable_media_metadata``: the media tables; ``reset_tables``: drop existing ones first)."""

    def __init__(
        self,
        sqlite_path: EPath,
        *,
        enable_sample_tables: bool = True,
        enable_media_metadata: bool = False,
        reset_tables: bool = True,
    ) -> None:
        self.sqlite_path = epath.normalize(os.fspath(sqlite_path))
        self.db = sqlite3.connect(self.sqlite_path)
        tables = (SAMPLE_SCHEMA if enable_sample_tables else ()) + (
            MEDIA_SCHEMA if enable_media_metadata else ()
        )
        for statement in tables:
            name = statement.split()[2]
            if reset_tables:
                self.db.execute(f"DROP TABLE IF EXISTS {name}")
            self.db.execute(statement.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        self.enable_sample_tables = enable_sample_tables

    def append_samples(self, rows: Sequence[IndexSample]) -> None:
        try:
            self.db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?, ?, ?)",
                [
                    (r.tar_file_id, r.sample_key, r.sample_index, r.byte_offset, r.byte_size)
                    for r in rows
                ],
            )
        except sqlite3.IntegrityError:
            keys = [r.sample_key for r in rows]
            raise DuplicateSampleKeyError(f"one of {keys[:3]}...", "?", "?") from None

    def append_parts(self, rows: Sequence[IndexSamplePart]) -> None:
        self.db.executemany(
            "INSERT INTO sample_parts VALUES (?, ?, ?, ?, ?)",
            [
                (
                    r.tar_file_id,
                    r.sample_index,
                    r.part_name,
                    r.content_byte_offset,
                    r.content_byte_size,
                )
                for r in rows
            ],
        )

    def append_media_metadata_batch(self, rows: Sequence[IndexMediaMetadata]) -> None:
        replace_media_rows(self.db, [(r.entry_key, r.metadata_type, r.metadata_json) for r in rows])

    def append_media_filter(self, *, strategy: str, patterns: str | None) -> None:
        record_media_filter(self.db, strategy, patterns or "")

    def close(self) -> None:
        if self.enable_sample_tables:
            for statement in INDEXES:
                self.db.execute(statement)
        self.db.commit()
        self.db.close()


class SqliteIndexReader:
    """Lookups in an ``index.sqlite`` (read-only; one connection per thread)."""

    def __init__(self, sqlite_path: EPath) -> None:
        local = ensure_local_copy(EPath(sqlite_path))
        self.sqlite_path = str(sqlite_path)
        self.db = ThreadLocalSqlite(f"file:{local}?mode=ro&immutable=1", is_uri=True)

    def _has_table(self, name: str) -> bool:
        row = self.db.select_one(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        )
        return row is not None

    def db_has_sample_parts(self) -> bool:
        return self._has_table("sample_parts")

    def db_has_media_metadata(self) -> bool:
        """Whether media metadata was prepared (our indexes always hold the empty media tables,
        so their presence alone says nothing; a prepare with media records its filter)."""
        if not self._has_table("media_filters"):
            return self._has_table("media_metadata")
        return self.db.select_one("SELECT 1 FROM media_filters LIMIT 1") is not None

    def list_all_samples(self) -> Generator[tuple[str, int, int], None, None]:
        """``(sample_key, byte_size, tar_file_id)`` of every sample."""
        yield from self.db.select_all(
            "SELECT sample_key, byte_size, tar_file_id FROM samples ORDER BY tar_file_id, sample_index"
        )

    def list_all_sample_parts(self) -> Generator[tuple[str, int, int], None, None]:
        """``(sample_key.part_name, size, tar_file_id)`` of every part."""
        yield from self.db.select_all(
            "SELECT s.sample_key || '.' || p.part_name, p.content_byte_size, p.tar_file_id "
            "FROM sample_parts p JOIN samples s ON s.tar_file_id = p.tar_file_id "
            "AND s.sample_index = p.sample_index ORDER BY p.tar_file_id, p.sample_index, "
            "p.content_byte_offset"
        )

    def list_sample_parts(self, sample_key: str) -> Generator[tuple[str, int, int], None, None]:
        """``(part_name, size, tar_file_id)`` of the parts of one sample."""
        yield from self.db.select_all(
            "SELECT p.part_name, p.content_byte_size, p.tar_file_id FROM sample_parts p "
            "JOIN samples s ON s.tar_file_id = p.tar_file_id AND s.sample_index = p.sample_index "
            "WHERE s.sample_key = ? ORDER BY p.content_byte_offset",
            (sample_key,),
        )

    def get_total_size(self) -> int:
        return int(self.db.select_one("SELECT COALESCE(SUM(byte_size), 0) FROM samples")[0])

    def get_sample_count(self) -> int:
        return int(self.db.select_one("SELECT COUNT(*) FROM samples")[0])

    def get_sample_part(self, key: str, part_name: str) -> ITarRawSamplePartPointer:
        row = self.db.select_one(
            "SELECT p.tar_file_id, p.content_byte_offset, p.content_byte_size FROM sample_parts p "
            "JOIN samples s ON s.tar_file_id = p.tar_file_id AND s.sample_index = p.sample_index "
            "WHERE s.sample_key = ? AND p.part_name = ?",
            (key, part_name),
        )
        if row is None:
            raise KeyError(
                f"Sample part not found: key={key}, part_name={part_name} in {self.sqlite_path}"
            )
        return ITarRawSamplePartPointer(
            tar_file_id=row[0], raw_byte_offset=row[1], raw_byte_size=row[2]
        )

    def get_sample_pointer_by_key(self, key: str) -> ITarSamplePointer:
        row = self.db.select_one(
            "SELECT tar_file_id, byte_offset, byte_size FROM samples WHERE sample_key = ?", (key,)
        )
        if row is None:
            raise KeyError(f"Sample key not found: {key}")
        return ITarSamplePointer(tar_file_id=row[0], byte_offset=row[1], byte_size=row[2])

    def get_media_metadata(self, entry_key: str) -> tuple[str, str] | None:
        if not self.db_has_media_metadata():
            return None
        row = self.db.select_one(
            "SELECT metadata_type, metadata_json FROM media_metadata WHERE entry_key = ?",
            (entry_key,),
        )
        return None if row is None else (row[0], row[1])

    def close(self) -> None:
        self.db.thread_close()


class JoinIndexWriter:
    """Writes a join index: per row, ``(shard_idx, byte_offset, byte_size)`` for each column (the
    primary dataset, then each secondary)."""

    def __init__(self, join_index_path: EPath) -> None:
        self.join_index_path = epath.normalize(os.fspath(join_index_path))
        self.rows: list[tuple[int, ...]] = []
        self.num_columns: int | None = None

    def append(self, *columns: tuple[int, int, int]) -> None:
        if self.num_columns is None:
            self.num_columns = len(columns)
        elif len(columns) != self.num_columns:
            raise ValueError(f"a join index row has {self.num_columns} columns, got {len(columns)}")
        self.rows.append(tuple(v for column in columns for v in column))

    def close(self) -> None:
        columns = self.num_columns or 0
        body = np.asarray(self.rows, dtype="<i8").reshape(-1, columns * 3)
        epath.write_bytes(self.join_index_path, MAGIC + struct.pack("<q", columns) + body.tobytes())


class JoinIndexReader:
    """Rows of a join index (all columns, or only ``column``); iterate, index, or read all."""

    def __init__(self, join_index_path: EPath, column: int | None = None) -> None:
        local = str(ensure_local_copy(EPath(join_index_path)))
        with open(local, "rb") as f:
            header = f.read(HEADER_SIZE)
        if header[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{join_index_path}: not a join index (bad magic)")
        self.num_columns = struct.unpack("<q", header[len(MAGIC) :])[0]
        table = np.memmap(local, dtype="<i8", mode="r", offset=HEADER_SIZE)
        self._table = table.reshape(-1, self.num_columns, 3)
        self.column = column
        self._row = 0

    def __len__(self) -> int:
        return len(self._table)

    def __getitem__(self, index: int) -> list[tuple[int, int, int]]:
        """One row: a ``(shard, offset, size)`` triple per column, or only ``column``'s triple
        (still in a one-element list, as the reference returns it)."""
        row = self._table[index]
        if self.column is not None:
            row = row[self.column : self.column + 1]
        return [tuple(int(v) for v in cell) for cell in row]  # type: ignore[misc]

    def __iter__(self) -> Iterator[Any]:
        while self._row < len(self):
            self._row += 1
            yield self[self._row - 1]

    def tell_row(self) -> int:
        return self._row

    def get_as_tensor(self) -> torch.Tensor:
        """All rows as an ``(N, num_columns, 3)`` tensor."""
        return torch.from_numpy(np.array(self._table))

    def close(self) -> None:
        self._table = self._table[:0]
