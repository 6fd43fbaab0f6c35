"""What is known about a sample without reading it: :class:`SampleMeta`.

Every prepared dataset carries per-sample metadata that costs no data read: the sample key and its
parts' byte sizes (``index.sqlite``), its byte range (the ``.tar.idx`` / ``.jsonl.idx``; a Parquet
row's file, row group and row), media
metadata (width, height, duration; written by ``prepare --media-metadata-*``), the token count of a
token window. ``SampleMeta`` exposes it for one sample; :func:`meta_reader` gives the per-leaf
reader behind it (memory-mapped indices, point queries on the SQLite index, nothing loaded per
dataset).

Two things use it, and they must agree:

- the ledger (``energon.ledger``) describes a sample (key, shard, byte offset, ...) from it;
- task-encoder hooks marked :func:`~energon.task_encoder.base.uses_sample_meta` (packing by size,
  grouping by aspect ratio, ...) decide from it instead of from decoded samples, in the real
  pipeline and in the ledger's simulation alike, so what they decide is known without reading data.
  Cost-based batching can use the same accessors.
"""

from __future__ import annotations

import bisect
import os
import sqlite3
from functools import cached_property
from typing import Any

from energon import epath


class MetaReader:
    """Per-sample metadata of one leaf (any kind): shards from ``shard_starts``, nothing else.

    Subclasses add what their format knows. Methods take the leaf's global sample index. Readers
    hold open files lazily and are never pickled with them.
    """

    def __init__(self, leaf: Any) -> None:
        self.leaf = leaf
        self._starts = leaf.shard_starts  # may be lazy: a binary search reads a few entries

    def __getstate__(self) -> dict[str, Any]:
        return {"leaf": self.leaf}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["leaf"])

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, index inside the shard)."""
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - int(self._starts[shard])

    def shard_name(self, index: int) -> str:
        return f"shard {self.locate(index)[0]}"

    def key(self, index: int) -> str | None:
        return None

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        """(byte offset, byte size) of the sample in its file, or (None, None) if unknown."""
        return None, None

    def part_sizes(self, index: int) -> dict[str, int]:
        return {}

    def media(self, index: int) -> dict[str, Any]:
        return {}

    def tokens(self, index: int) -> int | None:
        return None

    def location(self, index: int) -> dict[str, int]:
        """Where inside its shard the sample lies, beyond the byte offset (Parquet: row group and
        row); empty for formats whose byte offset says it all."""
        return {}


class WebdatasetMeta(MetaReader):
    """Keys and part sizes from ``index.sqlite`` (indexed point queries), byte ranges from the
    memory-mapped ``.tar.idx``, media metadata from the same SQLite file."""

    def __init__(self, leaf: Any) -> None:
        super().__init__(leaf)
        self._db: sqlite3.Connection | None = None
        self._tar_ids: dict[str, int] | None = None
        self._indices: dict[int, Any] = {}

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            from energon.format.sqlite_index import sample_tables_path

            path = sample_tables_path(self.leaf.root, "reading sample keys and part sizes")
            self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        return self._db

    def locate(self, index: int) -> tuple[int, int]:
        return self.leaf.locate(index)

    def shard_name(self, index: int) -> str:
        return self.leaf.shards.name(self.locate(index)[0])

    def _where(self, index: int) -> tuple[int, int]:
        """(tar_file_id, sample index inside the shard) as ``index.sqlite`` numbers them."""
        self._connection()
        shard, inner = self.locate(index)
        tar_id = self.leaf.shards.tar_file_id(shard)
        if tar_id is None:
            tar_id = self._tar_file_ids()[self.leaf.shards.name(shard)]
        return tar_id, inner

    def _tar_file_ids(self) -> dict[str, int]:
        """The shard numbering of ``.info.json`` (read only for shards that do not know it)."""
        if self._tar_ids is None:
            from energon.format.info import read_info

            self._tar_ids = {name: i for i, name in enumerate(read_info(self.leaf.root))}
        return self._tar_ids

    def key(self, index: int) -> str | None:
        tar_id, inner = self._where(index)
        row = (
            self._connection()
            .execute(
                "SELECT sample_key FROM samples WHERE tar_file_id=? AND sample_index=?",
                (tar_id, inner),
            )
            .fetchone()
        )
        return row[0] if row is not None else None

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        from energon.source.webdataset import tar_byte_index

        shard, inner = self.locate(index)
        tar_index = self._indices.get(shard)
        if tar_index is None:
            tar_index = self._indices[shard] = tar_byte_index(self.leaf.shard_path(shard))
        start, end = tar_index.byte_range(inner)
        return start, end - start

    def part_sizes(self, index: int) -> dict[str, int]:
        tar_id, inner = self._where(index)
        rows = self._connection().execute(
            "SELECT part_name, content_byte_size FROM sample_parts "
            "WHERE tar_file_id=? AND sample_index=?",
            (tar_id, inner),
        )
        return {name: int(size) for name, size in rows}

    def shard_first(self, shard: int) -> int:
        """The leaf index of the first sample of shard ``shard``."""
        return int(self._starts[shard])

    def shard_length(self, shard: int) -> int:
        ends = [*self._starts[1:], len(self.leaf)]
        return int(ends[shard]) - int(self._starts[shard])

    def shard_part_rows(
        self, shard: int, begin: int = 0, end: int | None = None
    ) -> list[tuple[int, str, int]]:
        """``(sample index inside the shard, part name, content bytes)`` of every part of the
        shard's samples ``begin <= i < end`` (default: all), from one query."""
        tar_id, _ = self._where(self.shard_first(shard))
        end = self.shard_length(shard) if end is None else end
        return (
            self._connection()
            .execute(
                "SELECT sample_index, part_name, content_byte_size FROM sample_parts "
                "WHERE tar_file_id=? AND sample_index>=? AND sample_index<?",
                (tar_id, begin, end),
            )
            .fetchall()
        )

    def shard_metas(
        self, source: int, shard: int, begin: int = 0, end: int | None = None
    ) -> list[SampleMeta]:
        """The :class:`SampleMeta` of the shard's samples ``begin <= i < end`` (default: all), with
        key, part sizes and media metadata filled by three queries (point queries per sample cost
        more than what is looked up: whoever looks at every sample of a stream, such as a blend
        weighted by size, goes through here)."""
        first = self.shard_first(shard)
        end = self.shard_length(shard) if end is None else end
        db = self._connection()
        tar_id, _ = self._where(first)
        keys = dict(
            db.execute(
                "SELECT sample_index, sample_key FROM samples "
                "WHERE tar_file_id=? AND sample_index>=? AND sample_index<?",
                (tar_id, begin, end),
            )
        )
        parts: dict[int, dict[str, int]] = {inner: {} for inner in keys}
        for inner, name, size in self.shard_part_rows(shard, begin, end):
            parts.setdefault(inner, {})[name] = size
        media = self._shard_media(db, tar_id)
        metas = []
        for inner in range(begin, end):
            meta = SampleMeta(self, source, first + inner)
            key = keys.get(inner)
            own_parts = parts.get(inner, {})
            meta._cache["key"] = key
            meta._cache["parts"] = own_parts
            meta._cache["media"] = {
                part: media[f"{key}.{part}"] for part in own_parts if f"{key}.{part}" in media
            }
            metas.append(meta)
        return metas

    @staticmethod
    def _shard_media(db: sqlite3.Connection, tar_id: int) -> dict[str, Any]:
        """``{"<key>.<part>": metadata}`` of one shard (empty without media metadata)."""
        if not has_table(db, "media_metadata"):
            return {}
        from energon.format.media_metadata import deserialize_media_metadata

        rows = db.execute(
            "SELECT m.entry_key, m.metadata_type, m.metadata_json FROM samples s "
            "JOIN media_metadata m ON m.entry_key >= s.sample_key || '.' "
            "AND m.entry_key < s.sample_key || '/' WHERE s.tar_file_id=?",
            (tar_id,),
        )
        return {entry: deserialize_media_metadata(kind, text) for entry, kind, text in rows}

    def media(self, index: int) -> dict[str, Any]:
        key = self.key(index)
        db = self._connection()
        if key is None or not has_table(db, "media_metadata"):
            return {}
        from energon.format.media_metadata import deserialize_media_metadata

        found = {}
        for part in self.part_sizes(index):
            row = db.execute(
                "SELECT metadata_type, metadata_json FROM media_metadata WHERE entry_key = ?",
                (f"{key}.{part}",),
            ).fetchone()
            if row is not None:
                found[part] = deserialize_media_metadata(row[0], row[1])
        return found


class JsonlMeta(MetaReader):
    """Record ``i`` of a JSONL file: key ``str(i)``, byte range from the ``.jsonl.idx``."""

    @cached_property
    def _offsets(self) -> Any:
        from energon.source.jsonl import jsonl_byte_index

        return jsonl_byte_index(self.leaf.path)

    def __getstate__(self) -> dict[str, Any]:
        return {"leaf": self.leaf}

    def shard_name(self, index: int) -> str:
        return epath.basename(self.leaf.path)

    def key(self, index: int) -> str | None:
        return str(index)

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        start, end = self._offsets.byte_range(index)
        return start, end - start


class ParquetMeta(MetaReader):
    """Row ``i`` of a Parquet/Arrow split: its file, row group (and that group's byte offset) and
    row from the memory-mapped row-group table; its key without reading data, unless the dataset
    names a key column (then only that column's window is read)."""

    def locate(self, index: int) -> tuple[int, int]:
        file, row, _, _ = self.leaf.locate(index)
        return file, row

    def shard_name(self, index: int) -> str:
        return self.leaf.shard_names[self.leaf.locate(index)[0]]

    def key(self, index: int) -> str | None:
        file, row, group, inner = self.leaf.locate(index)
        column = self.leaf.options.key_column
        if column is None:
            return f"{self.leaf.shard_names[file]}/{row}"
        from energon.source.parquet_read import table_reader

        window = table_reader().window(self.leaf.file_ref(file), group, inner, (column,))
        value = window.columns[column][inner - window.start].as_py()
        return None if value is None else str(value)

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        """The byte offset of the row's row group (a row has no byte range of its own)."""
        file, _, group, _ = self.leaf.locate(index)
        return int(self.leaf.group_row(file, group)[3]), None

    def location(self, index: int) -> dict[str, int]:
        _, row, group, _ = self.leaf.locate(index)
        return {"row_group": group, "row": row}


class TokenMeta(MetaReader):
    """Window ``i`` of a token dataset: key ``<name>/<i>``, its first byte span in the ``.bin``,
    and its token count (sequence length plus the extra label token)."""

    def shard_name(self, index: int) -> str:
        return self.leaf.name

    def key(self, index: int) -> str | None:
        return f"{self.leaf.name}/{index}"

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        spans = self.leaf.dataset.byte_spans(index)
        if not spans:
            return None, None
        return int(spans[0][1]), int(sum(stop - start for _, start, stop in spans))

    def tokens(self, index: int) -> int | None:
        config = self.leaf.dataset.config
        return int(config.sequence_length + config.extra)


class JoinMeta(MetaReader):
    """Row ``i`` of a join: the primary member's shard, byte range and key (a Parquet primary's
    file, row group and row, through that member's own reader)."""

    @cached_property
    def _primary(self) -> WebdatasetMeta:
        from energon.source.webdataset import WebdatasetLeaf

        member = self.leaf.members[0]
        return WebdatasetMeta(
            WebdatasetLeaf.open(
                member.root, split_part=member.split_part, dataset_config=member.dataset_config
            )
        )

    @cached_property
    def _parquet(self) -> ParquetMeta | None:
        """The Parquet primary's reader (None for a WebDataset primary)."""
        reader = self.leaf.readers[0]
        return ParquetMeta(reader.leaf) if reader.kind == "parquet" else None

    def __getstate__(self) -> dict[str, Any]:
        return {"leaf": self.leaf}

    def _row(self, index: int) -> tuple[int, int, int]:
        shard, offset, size = self.leaf._table()[index][0].tolist()
        return shard, offset, size

    def _parquet_index(self, index: int) -> int:
        return self.leaf.readers[0].leaf_index(self._row(index))

    def shard_name(self, index: int) -> str:
        return self.leaf.members[0].shards[self._row(index)[0]]

    def byte_range(self, index: int) -> tuple[int | None, int | None]:
        if self._parquet is not None:
            return self._parquet.byte_range(self._parquet_index(index))
        _, offset, size = self._row(index)
        return offset, size

    def location(self, index: int) -> dict[str, int]:
        if self._parquet is not None:
            return self._parquet.location(self._parquet_index(index))
        return {}

    def key(self, index: int) -> str | None:
        if self._parquet is not None:
            return self._parquet.key(self._parquet_index(index))
        from energon.format.info import read_info
        from energon.source.webdataset import tar_byte_index

        shard, offset, _ = self._row(index)
        member = self.leaf.members[0]
        name = member.shards[shard]
        offsets = tar_byte_index(os.path.join(member.root, name)).offsets
        inner = int(bisect.bisect_left(offsets, offset))
        primary = self._primary
        db = primary._connection()
        tar_id = {n: i for i, n in enumerate(read_info(member.root))}[name]
        row = db.execute(
            "SELECT sample_key FROM samples WHERE tar_file_id=? AND sample_index=?",
            (tar_id, inner),
        ).fetchone()
        return row[0] if row is not None else None


_READERS = {
    "webdataset": WebdatasetMeta,
    "jsonl": JsonlMeta,
    "tokens": TokenMeta,
    "join": JoinMeta,
    "parquet": ParquetMeta,
}
_READER_ATTRIBUTE = "_energon_meta_reader"


class _ReaderSlot:
    """A leaf's metadata reader in the process that made it, kept on the leaf itself: it goes
    with the leaf (a module-level cache kept every leaf ever built, with its open index
    database and shard table), and it pickles, and so reaches a spawned worker, empty."""

    __slots__ = ("pid", "reader")

    def __init__(self, reader: MetaReader) -> None:
        self.pid = os.getpid()
        self.reader = reader

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ReaderSlot, (None,))


def meta_reader(leaf: Any) -> MetaReader:
    """The metadata reader of a leaf (one per leaf object and process: a forked worker opens its
    own database connection). A leaf that wraps another (the ledger's metadata leaves) hands out
    its own through ``sample_meta_reader()``."""
    own = getattr(leaf, "sample_meta_reader", None)
    if own is not None:
        return own()
    slot = getattr(leaf, "__dict__", {}).get(_READER_ATTRIBUTE)
    if slot is not None and slot.reader is not None and slot.pid == os.getpid():
        return slot.reader
    cls = _READERS.get(getattr(leaf, "kind", ""), MetaReader)
    if cls is WebdatasetMeta and not hasattr(leaf, "shard_names"):
        cls = MetaReader  # a leaf that calls itself a webdataset without being one (tests)
    reader = cls(leaf)
    if hasattr(leaf, "__dict__"):  # (a leaf with slots only gets a new reader each time)
        leaf.__dict__[_READER_ATTRIBUTE] = _ReaderSlot(reader)
    return reader


def has_table(db: sqlite3.Connection, name: str) -> bool:
    """Whether an index database holds table ``name`` (optional tables such as the media
    metadata exist only where ``energon prepare`` wrote them)."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,))
    return row.fetchone() is not None


class SampleMeta:
    """One sample as known without reading it: which source and index, and (looked up on first
    access) its key, shard, byte range, part sizes, media metadata and token count.

    ``source`` is the sample's source number in the pipeline, ``index`` its index in the leaf.
    """

    __slots__ = ("source", "index", "reader", "_cache")

    def __init__(self, reader: MetaReader, source: int, index: int) -> None:
        self.reader = reader
        self.source = source
        self.index = index
        self._cache: dict[str, Any] = {}

    def _get(self, name: str, compute: Any) -> Any:
        if name not in self._cache:
            self._cache[name] = compute(self.index)
        return self._cache[name]

    @property
    def dataset(self) -> str:
        return self.reader.leaf.root

    @property
    def split_part(self) -> str:
        return self.reader.leaf.split_part

    @property
    def subflavors(self) -> dict[str, Any]:
        return dict(self.reader.leaf.subflavors)

    @property
    def key(self) -> str | None:
        return self._get("key", self.reader.key)

    @property
    def shard(self) -> str:
        return self._get("shard", self.reader.shard_name)

    @property
    def byte_offset(self) -> int | None:
        return self._get("range", self.reader.byte_range)[0]

    @property
    def byte_size(self) -> int | None:
        """Bytes of the sample in its file (all parts and headers)."""
        return self._get("range", self.reader.byte_range)[1]

    @property
    def part_sizes(self) -> dict[str, int]:
        """Content bytes of each part (``{"jpg": 48213, "txt": 120}``; WebDatasets)."""
        return self._get("parts", self.reader.part_sizes)

    @property
    def media(self) -> dict[str, Any]:
        """Media metadata per part (prepared with ``--media-metadata-*``), else empty."""
        return self._get("media", self.reader.media)

    @property
    def tokens(self) -> int | None:
        """Tokens of a token-dataset window, else None."""
        return self._get("tokens", self.reader.tokens)

    def describe(self) -> dict[str, Any]:
        """The sample as plain data (what the ledger prints)."""
        return {
            "key": self.key,
            "dataset": self.dataset,
            "split": self.split_part,
            "shard": self.shard,
            "byte_offset": self.byte_offset,
            "index": self.index,
            "source": self.source,
            "subflavors": self.subflavors,
            **self._get("location", self.reader.location),
        }

    def __repr__(self) -> str:
        return f"SampleMeta(source={self.source}, index={self.index}, dataset={self.dataset!r})"
