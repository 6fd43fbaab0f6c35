"""The Parquet leaf: one split of a Parquet or Arrow dataset (a prepared folder, a folder used as it
is, or a single file), readable by global row index.

Rows are numbered across the split's files in order (files take the place of a WebDataset's
shards: the plan cuts slices at file boundaries, ``simulate`` counts rows per file, a ledger entry
names the file, row group and row). Reading a row decodes its row group's window of the wanted
columns once (:mod:`energon.source.parquet_read`) and serves the next rows from it.

Columns are a sample's parts. ``.nv-meta/dataset.yaml`` says how they become fields, exactly as for
a WebDataset (``sample_type`` + ``field_map`` naming columns, a ``sample_loader``, or crude dicts),
plus two optional keys of its own: ``key_column`` (the column that holds each row's ``__key__``;
default ``<file>/<row>``) and ``column_extensions`` (``{image: jpg}``: how binary columns
decode). Binary values (and Hugging Face image/audio structs ``{bytes, path}``) decode like tar
parts of that extension; without one, by the struct's path, else by the column's name when it is
a part name (``jpg``, ``txt``, ``image.png``), else by their magic bytes (else they stay bytes). Other values arrive as Python values (str, int, float, list, dict).
Without a ``dataset.yaml`` (and for folders used as they are) samples are crude dicts for cookers.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from typing import Any

import numpy as np

from energon import epath
from energon.decode.image import IMAGE_EXTENSIONS
from energon.decode.sample_decoder import AV_EXTENSIONS
from energon.decode.sniff import guess_extension
from energon.errors import (
    DamagedSampleError,
    DatasetConfigError,
    EmptyDatasetError,
    SampleException,
    SampleReadError,
)
from energon.format.layout import DATASET_YAML_FILENAME, MAIN_FOLDER_NAME, SPLIT_YAML_FILENAME
from energon.format.parquet import (
    FIRST_ROW,
    OFFSET,
    SIZE,
    column_chunk_table,
    discover_table_files,
    is_prepared_parquet,
    read_parquet_index,
    require_pyarrow,
    row_group_table,
    row_keys,
    scan_files,
    table_format,
)
from energon.format.shard_table import listed_shards_fingerprint
from energon.format.split import read_split, warn_unmatched_exclude
from energon.samples.source_info import make_source_info
from energon.source.dataset_config import (
    SampleBuilder,
    parse_dataset_config,
    read_dataset_yaml,
)
from energon.source.parquet_read import HOLE_BYTES, FileRef, coalesce_ranges, table_reader
from energon.source.prefetch import CHUNK_BYTES
from energon.source.shard_reader import RecordOffsets, cumulative_starts, shard_reader

#: ``dataset.yaml`` keys that only Parquet datasets have
PARQUET_YAML_KEYS = ("key_column", "column_extensions")


@dataclasses.dataclass(frozen=True)
class ColumnOptions:
    """How a Parquet dataset's columns become parts: the key column, decoding extensions."""

    key_column: str | None = None
    extensions: dict[str, str] = dataclasses.field(default_factory=dict)


def load_parquet_builder(
    root: str, dataset_config: str, columns: list[str]
) -> tuple[SampleBuilder, ColumnOptions]:
    """The builder and column options of ``.nv-meta/<dataset_config>`` (crude dicts without
    one), checked against the dataset's ``columns``."""
    where = epath.join(root, MAIN_FOLDER_NAME, dataset_config)
    if not epath.is_file(where):
        return SampleBuilder("crude"), ColumnOptions()
    data = dict(read_dataset_yaml(root, dataset_config))
    key_column = data.pop("key_column", None)
    extensions = data.pop("column_extensions", None) or {}
    if not isinstance(extensions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extensions.items()
    ):
        raise DatasetConfigError(f"{where}: column_extensions must map column names to extensions")
    for name in [key_column, *extensions]:
        if name is not None and name not in columns:
            raise DatasetConfigError(f"{where}: no column {name!r}; columns: {columns}")
    builder = parse_dataset_config(root, data, where=where)
    if builder.kind == "field_map":
        _check_fields(builder, columns, where)
    options = ColumnOptions(key_column, {k: v.lstrip(".") for k, v in extensions.items()})
    return builder, options


def _check_fields(builder: SampleBuilder, columns: list[str], where: str) -> None:
    for field, options in builder.field_map.fields.items():
        if not any(option.part in columns for option in options):
            spec = builder.field_map.specs[field]
            raise DatasetConfigError(
                f"{where}: field {field!r} ({spec!r}) names no column of the dataset; "
                f"columns: {columns}"
            )


class ColumnChunks:
    """Where each row group's column chunks lie (``parquet_column_chunks.npy`` of a prepared
    dataset, or the footers of one used as it is): remote reads fetch only the wanted ones."""

    def __init__(self, source: np.ndarray | str, leaf_columns: list[str]) -> None:
        self.source = source  # [row groups, leaf columns, 2], or the path of a prepared one
        self.leaf_columns = leaf_columns
        self._mapped: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": None}

    def table(self) -> np.ndarray:
        if isinstance(self.source, np.ndarray):
            return self.source
        if self._mapped is None:
            self._mapped = np.load(self.source, mmap_mode="r")
        return self._mapped

    def mask(self, wanted: tuple[str, ...] | None) -> np.ndarray | None:
        """Which leaf columns ``wanted`` needs; None when it needs all of them."""
        if wanted is None:
            return None
        mask = np.array([column in wanted for column in self.leaf_columns], dtype=bool)
        return None if mask.all() else mask

    def ranges(self, rows: slice, mask: np.ndarray) -> list[tuple[int, int]]:
        """The requests that fetch the masked column chunks of row-group table rows ``rows``."""
        chunks = np.asarray(self.table()[rows][:, mask]).reshape(-1, 2)
        return coalesce_ranges(
            zip(chunks[:, 0], chunks[:, 0] + chunks[:, 1]), HOLE_BYTES, CHUNK_BYTES
        )


@dataclasses.dataclass
class _Files:
    """The split's files and where their row groups are in the row-group table."""

    names: list[str]
    paths: list[str]
    formats: list[str]
    sizes: list[int]
    rows: list[int]
    preludes: list[tuple[int, int]]
    group_ranges: list[tuple[int, int]]  # [first, end) rows of the table per file


class ParquetLeaf:
    """One split of a Parquet/Arrow dataset (a :class:`~energon.source.leaf.LeafDataset`)."""

    kind = "parquet"

    def __init__(
        self,
        root: str,
        split_part: str,
        files: _Files,
        table: np.ndarray | str,
        columns: list[str],
        builder: SampleBuilder,
        options: ColumnOptions,
        subflavors: dict[str, Any],
        chunks: ColumnChunks | None = None,
    ) -> None:
        self.root = root
        self.split_part = split_part
        self.files = files
        self._table_source = table  # the table, or the path of a prepared one (memory-mapped)
        self.columns = columns
        self.builder = builder
        self.options = options
        self.subflavors = subflavors
        self.excluded: frozenset[int] = frozenset()
        self.shard_names = files.names
        self.shard_counts = files.rows
        self._starts = [int(s) for s in cumulative_starts(files.rows)]
        self._wanted = _wanted_columns(builder, options, columns)
        self.chunks = chunks
        self._leaf_mask = chunks.mask(self._wanted) if chunks is not None else None
        self._mapped: np.ndarray | None = None
        self._refs: dict[int, FileRef] = {}
        self._firsts: dict[int, list[int]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": None, "_refs": {}, "_firsts": {}}

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        *,
        split_part: str,
        split_config: str | None = None,
        dataset_config: str = DATASET_YAML_FILENAME,
        subflavors: dict[str, Any] | None = None,
    ) -> ParquetLeaf:
        """A prepared dataset's split; a folder or file that is not prepared is used as it is
        (every split part is all of it, as for a JSONL file; footers are read now)."""
        require_pyarrow()
        root = epath.normalize(path)
        if is_prepared_parquet(root):
            return cls._open_prepared(root, split_part, split_config, dataset_config, subflavors)
        return cls._open_as_is(root, subflavors)

    @classmethod
    def _open_prepared(
        cls,
        root: str,
        split_part: str,
        split_config: str | None,
        dataset_config: str,
        subflavors: dict[str, Any] | None,
    ) -> ParquetLeaf:
        index = read_parquet_index(root)
        split = read_split(root, split_config or SPLIT_YAML_FILENAME)
        by_name = {f["name"]: i for i, f in enumerate(index.files)}
        names = split.shards(split_part)
        missing = [n for n in names if n not in by_name]
        if missing:
            raise DatasetConfigError(
                f"{root}: split {split_part!r} lists files that were not prepared: {missing[:5]} "
                f"(run `energon prepare {root}`)"
            )
        starts = index.group_starts
        chosen = [index.files[by_name[n]] for n in names]
        files = _Files(
            names=names,
            paths=[epath.join(root, n) for n in names],
            formats=[f["format"] for f in chosen],
            sizes=[int(f["size"]) for f in chosen],
            rows=[int(f["rows"]) for f in chosen],
            preludes=[tuple(f.get("prelude", (0, 0))) for f in chosen],
            group_ranges=[(int(starts[by_name[n]]), int(starts[by_name[n] + 1])) for n in names],
        )
        columns = [name for name, _ in index.columns]
        builder, options = load_parquet_builder(root, dataset_config, columns)
        leaf = cls(
            root,
            split_part,
            files,
            index.table_path,
            columns,
            builder,
            options,
            {**builder.subflavors, **(subflavors or {})},
            ColumnChunks(index.chunks_path, index.leaf_columns) if index.chunks_path else None,
        )
        leaf.excluded = leaf._resolve_sample_excludes(split.sample_excludes(), split.source)
        return leaf._checked()

    @classmethod
    def _open_as_is(cls, root: str, subflavors: dict[str, Any] | None) -> ParquetLeaf:
        if table_format(root) is not None and epath.is_file(root):
            base, names, paths = epath.dirname(root), [epath.basename(root)], [root]
            layouts = scan_files(base, names)
        else:
            names = discover_table_files(root)
            if not names:
                raise FileNotFoundError(f"{root}: no Parquet or Arrow files found")
            paths = [epath.join(root, n) for n in names]
            layouts = scan_files(root, names)
        from energon.format.parquet import check_same_columns

        check_same_columns(layouts)
        counts = np.cumsum([0, *[len(f.groups) for f in layouts]])
        files = _Files(
            names=names,
            paths=paths,
            formats=[f.format for f in layouts],
            sizes=[f.size for f in layouts],
            rows=[f.rows for f in layouts],
            preludes=[f.prelude for f in layouts],
            group_ranges=[(int(a), int(b)) for a, b in zip(counts[:-1], counts[1:])],
        )
        columns = [name for name, _ in layouts[0].columns]
        builder = SampleBuilder("crude")
        return cls(
            root,
            "",
            files,
            row_group_table(layouts),
            columns,
            builder,
            ColumnOptions(),
            dict(subflavors or {}),
            _footer_chunks(layouts),
        )._checked()

    def _checked(self) -> ParquetLeaf:
        if len(self) == 0:
            raise EmptyDatasetError(f"{self.root}: split {self.split_part!r} has no rows")
        from energon.source.parquet_read import READ_BUDGET

        table = self._table()
        arrow = [i for i, f in enumerate(self.files.formats) if f == "arrow"]
        for i in arrow:
            first, end = self.files.group_ranges[i]
            sizes = table[first:end, SIZE]
            if len(sizes) and int(sizes.max()) > READ_BUDGET // 2:
                group = int(np.argmax(sizes))
                raise DatasetConfigError(
                    f"{self.files.paths[i]}: record batch {group} has {int(sizes.max()):,} bytes, "
                    f"more than half the read budget (ENERGON_PARQUET_READ_BUDGET={READ_BUDGET}); "
                    "raise the budget or rewrite the file with smaller record batches"
                )
        return self

    # -- the index -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def shard_starts(self) -> list[int]:
        return self._starts[:-1]

    @property
    def remote(self) -> bool:
        return epath.is_remote(self.root)

    def _table(self) -> np.ndarray:
        if isinstance(self._table_source, np.ndarray):
            return self._table_source
        if self._mapped is None:
            self._mapped = np.load(self._table_source, mmap_mode="r")
        return self._mapped

    def locate(self, index: int) -> tuple[int, int, int, int]:
        """(file number, row in the file, row group in the file, row in the row group)."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range [0, {len(self)}) in {self.root}")
        file = bisect.bisect_right(self._starts, index) - 1
        row = index - self._starts[file]
        firsts = self._firsts.get(file)
        if firsts is None:  # the file's row-group starts, as a list (bisect beats numpy per row)
            first, end = self.files.group_ranges[file]
            firsts = self._firsts[file] = self._table()[first:end, FIRST_ROW].tolist()
        group = bisect.bisect_right(firsts, row) - 1
        return file, row, group, row - firsts[group]

    def group_row(self, file: int, group: int) -> np.ndarray:
        """The table row of a file's row group: (file, first row, rows, byte offset, byte size)."""
        return self._table()[self.files.group_ranges[file][0] + group]

    def file_ref(self, file: int) -> FileRef:
        ref = self._refs.get(file)
        if ref is None:
            first, end = self.files.group_ranges[file]
            groups = np.asarray(self._table()[first:end, 1:5])
            ref = FileRef(
                path=self.files.paths[file],
                format=self.files.formats[file],
                size=self.files.sizes[file],
                groups=groups,
                prelude=self.files.preludes[file],
                index=self._byte_index(file, groups),
            )
            self._refs[file] = ref
        return ref

    def _projects(self, file: int) -> bool:
        """Remote reads of this file fetch only the wanted columns' chunks (not all columns)."""
        return self._leaf_mask is not None and self.files.formats[file] == "parquet"

    def _byte_index(self, file: int, groups: np.ndarray) -> Any:
        """Record boundaries for remote reads: row groups (a read that no hint covered fetches
        ahead to a row-group end), or None when only some columns are wanted (exact reads)."""
        if not self.remote or self._projects(file):
            return None
        return _group_offsets(groups, self.files.sizes[file])

    def sample_location(self, index: int) -> dict[str, Any]:
        """Where row ``index`` lies: its file, row group (and that group's byte offset) and row."""
        file, row, group, _ = self.locate(index)
        offset = int(self.group_row(file, group)[OFFSET])
        return {"shard": self.shard_names[file], "offset": offset, "row_group": group, "row": row}

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Hint that rows ``[first, end)`` will be read soon: their row groups' bytes are fetched
        in the background (object storage only); only the wanted columns' chunks when the
        dataset's index knows where they are."""
        if not self.remote or first >= end:
            return
        reader = shard_reader()
        while first < end:
            file, _, group, _ = self.locate(first)
            last = min(end, self._starts[file + 1]) - 1
            _, _, last_group, _ = self.locate(last)
            ref = self.file_ref(file)
            if self._projects(file):
                table_first = self.files.group_ranges[file][0]
                rows = slice(table_first + group, table_first + last_group + 1)
                for start, stop in self.chunks.ranges(rows, self._leaf_mask):
                    reader.prefetch_bytes(ref.path, start, stop, later)
            elif ref.index is not None:
                reader.prefetch(ref.path, group, last_group + 1, ref.index, later)
            first = last + 1

    # -- reading -------------------------------------------------------------------------------

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        """Read, decode and build row ``index``."""
        file, row, group, inner = self.locate(index)
        ref = self.file_ref(file)
        name = self.shard_names[file]
        key = None
        try:
            window = table_reader().window(ref, group, inner, self._wanted)
        except DamagedSampleError as e:
            where = f"{e.message} (row {row}, index {index})"
            raise DamagedSampleError(e.path, e.offset, where, f"{name}/{row}") from None
        try:
            values = {c: a[inner - window.start].as_py() for c, a in window.columns.items()}
            key = self._key(values, name, row)
            parts = {c: self._part(c, v, decoder, key) for c, v in values.items()}
            base = {
                "__key__": key,
                "__restore_key__": restore_key,
                "__subflavors__": dict(self.subflavors),
                "__sources__": (make_source_info(self.root, index, name, tuple(parts)),),
            }
            return self.builder.build(parts, base, name)
        except Exception as e:
            offset = int(self.group_row(file, group)[OFFSET])
            where = f"{ref.path} row group {group} row {row} (index {index}, key {key!r}, byte offset {offset})"
            if isinstance(e, SampleException):
                raise SampleReadError(f"{where}: {e}") from e
            raise SampleReadError(f"{where}: {type(e).__name__}: {e}") from e

    def _key(self, values: dict[str, Any], file_name: str, row: int) -> str:
        column = self.options.key_column
        if column is None:
            return f"{file_name}/{row}"
        key = values.get(column)
        if key is None:
            raise SampleReadError(f"the key column {column!r} is empty")
        return str(key)

    def _part(self, column: str, value: Any, decoder: Any, key: str) -> Any:
        """A column's value as a part: binary values decode like tar parts (module docstring)."""
        hint = None
        if isinstance(value, dict) and isinstance(value.get("bytes"), bytes):
            value, path = value["bytes"], value.get("path")
            if isinstance(path, str) and "." in path.rsplit("/", 1)[-1]:
                hint = path.rsplit(".", 1)[-1].lower()
        if not isinstance(value, bytes) or decoder is None:
            return value
        extension = self.options.extensions.get(column) or hint
        if extension is None and not _names_extension(column):
            extension = guess_extension(value)
        part = f"{column}.{extension}" if extension else column
        return decoder.decode_part(
            part, value, key=key, dataset=self.root, dataset_allows_pickle=self.builder.allow_pickle
        )

    def key_indices(self, keys: set[str]) -> tuple[list[int], set[str]]:
        """Indices of the rows with these keys (for cursor edits that exclude keys). Without a
        key column, keys are ``<file>/<row>`` and nothing is read."""
        indices, hits = [], set()
        if self.options.key_column is None:
            by_name = {n: i for i, n in enumerate(self.shard_names)}
            for key in keys:
                name, _, row = key.rpartition("/")
                file = by_name.get(name)
                if file is not None and row.isdigit() and int(row) < self.shard_counts[file]:
                    indices.append(self._starts[file] + int(row))
                    hits.add(key)
            return indices, hits
        for file in range(len(self.shard_names)):
            for row, key in enumerate(self._file_keys(file)):
                if key in keys:
                    indices.append(self._starts[file] + row)
                    hits.add(key)
        return indices, hits

    def _file_keys(self, file: int) -> list[str]:
        """The ``__key__`` of every row of one file (reads the key column, if there is one)."""
        return row_keys(
            self.files.paths[file],
            self.files.formats[file],
            self.shard_names[file],
            self.shard_counts[file],
            self.options.key_column,
        )

    def _resolve_sample_excludes(
        self, excludes: set[tuple[str, str]], source: str
    ) -> frozenset[int]:
        """Global indices of ``<file>/<key>`` excludes of ``split.yaml``: ``<key>`` is a value of
        the key column, or (without one) the row number, so that the entry is the row's key. An
        entry that matches no row is a warning naming it, as for tar shards."""
        by_name = {n: i for i, n in enumerate(self.shard_names)}
        wanted: dict[int, set[str]] = {}
        for name, key in excludes:
            if name in by_name:
                wanted.setdefault(by_name[name], set()).add(key)
        found: set[int] = set()
        for file, keys in sorted(wanted.items()):
            if self.options.key_column is None:
                rows = {
                    k: [int(k)] for k in keys if k.isdigit() and int(k) < self.shard_counts[file]
                }
            else:
                rows = {}
                for row, key in enumerate(self._file_keys(file)):
                    if key in keys:
                        rows.setdefault(key, []).append(row)
            for key in sorted(keys - set(rows)):
                name = self.shard_names[file]
                warn_unmatched_exclude(source, f"{name}/{key}", f"{name} has no row {key!r}")
            found.update(self._starts[file] + row for hits in rows.values() for row in hits)
        return frozenset(found)

    # -- identity ------------------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        return {
            "path": self.root,
            "split_part": self.split_part,
            "format": "parquet",
            "shards": listed_shards_fingerprint(self.shard_names, self.shard_counts),
        }

    def config(self) -> dict[str, Any]:
        return {
            **self.fingerprint(),
            "sample": self.builder.config(),
            "columns": list(self._wanted) if self._wanted is not None else "all",
            "key_column": self.options.key_column,
        }


def _wanted_columns(
    builder: SampleBuilder, options: ColumnOptions, columns: list[str]
) -> tuple[str, ...] | None:
    """The columns a sample needs (None: all): the field map's, or those a part filter keeps,
    plus the key column. Only these are read and decoded."""
    if builder.kind == "crude" and builder.part_filter is None:
        return None
    wanted = [c for c in columns if builder.wants_part(c)]
    if options.key_column is not None and options.key_column not in wanted:
        wanted.append(options.key_column)
    return tuple(wanted)


def _names_extension(column: str) -> bool:
    """The column's name says how to decode it, as a tar part's name does (``jpg``, ``txt``,
    ``image.png``)."""
    return "." in column or column.lower() in _DECODED_EXTENSIONS


_DECODED_EXTENSIONS = frozenset(
    [*IMAGE_EXTENSIONS, *AV_EXTENSIONS]
    + "txt text transcript cls cls2 index inx id json jsn npy npz pth pyd pickle pkl gz".split()
)


def _footer_chunks(layouts: list[Any]) -> ColumnChunks | None:
    """The column chunks the files' footers describe (None for Arrow files)."""
    table = column_chunk_table(layouts)
    if table is None:
        return None
    return ColumnChunks(table, next(f.leaf_columns for f in layouts if f.chunks is not None))


def _group_offsets(groups: np.ndarray, file_size: int) -> Any:
    """The opener of a file's row-group byte boundaries for remote prefetching (None when row
    groups do not follow each other in the file)."""
    if not len(groups):
        return None
    bounds = np.concatenate([groups[:, 2], [int(groups[-1, 2] + groups[-1, 3])]]).astype(np.int64)
    if np.any(np.diff(bounds) <= 0) or bounds[-1] > file_size:
        return None
    index = RecordOffsets(bounds)
    return lambda path: index
