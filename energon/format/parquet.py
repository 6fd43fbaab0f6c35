"""Parquet and Arrow IPC datasets on disk: their files, the row groups inside, and the index that
``energon prepare`` writes for them.

A Parquet dataset is a folder (or an object-storage prefix) of ``*.parquet`` files; Arrow IPC files
(``*.arrow``, ``*.feather``, ``*.ipc``: the file or the stream format, e.g. Hugging Face's cache
files) work the same way. Each file holds row groups (Arrow: record batches), the unit a reader
decodes. The row counts and byte ranges of every row group are in the files' own footers (Parquet)
or message headers (Arrow), so a folder can be used as it is: opening it reads each file's footer.
Preparing it once writes these numbers into ``.nv-meta`` so that nothing is scanned at training
time:

- ``.nv-meta/parquet.json``: the files in order with their format, size, row count and number of
  row groups, and the columns (written last: its presence means "prepared");
- ``.nv-meta/parquet_row_groups.npy``: one int64 row per row group, all files concatenated:
  ``(file number, first row in its file, rows, byte offset, byte size)`` (memory-mapped by readers);
- ``.nv-meta/parquet_column_chunks.npy``: per row group (same order) and Parquet leaf column, the
  column chunk's ``(byte offset, byte size)`` (``-1`` for Arrow files), so that remote reads can
  fetch only the columns a field map uses; ``parquet.json`` names each leaf column's top-level
  column (``leaf_columns``). Datasets prepared without it fetch whole row groups;
- ``.nv-meta/split.yaml``: files per split, in the WebDataset format (files take the place of shards);
- ``.nv-meta/dataset.yaml`` (optional): how columns become sample fields, in the WebDataset format;
- ``.nv-meta/index.uuid``: changes with every prepare (join indices depend on it).

A WebDataset's files (``.info.json``, ``index.sqlite``) are not written, so a Parquet dataset is
never mistaken for one, by energon or by Megatron-Energon. pyarrow is an optional dependency
(``pip install 'energon-loader[parquet]'``): this module imports it only when a file is read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from energon import epath
from energon.errors import ParquetFormatError
from energon.format.layout import INDEX_UUID_FILENAME, MAIN_FOLDER_NAME, SPLIT_YAML_FILENAME
from energon.format.split import split_config_text

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
TABLE_SUFFIXES = PARQUET_SUFFIXES + ARROW_SUFFIXES
PARQUET_INFO_FILENAME = "parquet.json"
ROW_GROUPS_FILENAME = "parquet_row_groups.npy"
CHUNKS_FILENAME = "parquet_column_chunks.npy"
INFO_FORMAT = "energon-parquet"
INFO_VERSION = 1
# columns of the row-group table
FILE, FIRST_ROW, ROWS, OFFSET, SIZE = range(5)
INSTALL_HINT = "pip install 'energon-loader[parquet]' (or pip install pyarrow)"


def require_pyarrow() -> Any:
    """The ``pyarrow`` module, or an ImportError that says which extra to install."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401 - submodules used through the package
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise ImportError(f"Parquet and Arrow datasets need pyarrow: {INSTALL_HINT}") from e
    return pyarrow


def table_format(name: str) -> str | None:
    """``"parquet"``, ``"arrow"`` or None, by the file name's suffix."""
    lowered = name.lower()
    if lowered.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lowered.endswith(ARROW_SUFFIXES):
        return "arrow"
    return None


@dataclasses.dataclass
class FileLayout:
    """One file as its footer or headers describe it."""

    name: str  # relative to the dataset root (the file name itself for a single file)
    format: str  # "parquet" | "arrow"
    size: int
    etag: str
    groups: np.ndarray  # int64 [row groups, 4]: first row, rows, byte offset, byte size
    columns: list[tuple[str, str]]  # (name, Arrow type)
    prelude: tuple[int, int] = (0, 0)  # Arrow: bytes of the schema (and dictionary) messages
    # Parquet: int64 [row groups, leaf columns, 2]: each column chunk's byte offset and size
    chunks: np.ndarray | None = None
    leaf_columns: list[str] | None = None  # Parquet: the top-level column of each leaf column

    @property
    def rows(self) -> int:
        return int(self.groups[:, 1].sum()) if len(self.groups) else 0

    def info(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "format": self.format,
            "size": self.size,
            "etag": self.etag,
            "rows": self.rows,
            "row_groups": len(self.groups),
        }
        if self.format == "arrow":
            out["prelude"] = list(self.prelude)
        return out


# ---------------------------------------------------------------------------------------------
# Reading footers and headers


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over ``read(start, end)`` (ranged GETs, or pread through the
    shard reader), for pyarrow: it reads footers and column chunks through it, nothing more."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, name: str) -> None:
        super().__init__()
        self._read = read
        self._size = size
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        data = self._read(self._pos, end)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)


def scan_file(path: str, name: str) -> FileLayout:
    """The layout of one Parquet or Arrow file (its footer, or its message headers); a damaged
    file is a :class:`ParquetFormatError` naming it."""
    fmt = table_format(name)
    if fmt is None:
        raise ParquetFormatError(f"{path}: not a Parquet or Arrow file (by its name)")
    pa = require_pyarrow()
    size, etag = epath.stat(path)
    try:
        if fmt == "parquet":
            return _scan_parquet(path, name, size, etag)
        return _scan_arrow(path, name, size, etag)
    except ParquetFormatError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ParquetFormatError(f"{path}: cannot read the {fmt} file: {e}") from e


def _scan_parquet(path: str, name: str, size: int, etag: str) -> FileLayout:
    pq = require_pyarrow().parquet
    source = RangedFile(lambda a, b: epath.read_range(path, a, b), size, path)
    metadata = pq.ParquetFile(source, pre_buffer=False).metadata
    groups = np.zeros((metadata.num_row_groups, 4), dtype=np.int64)
    chunks = np.zeros((metadata.num_row_groups, metadata.num_columns, 2), dtype=np.int64)
    row = 0
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        chunks[g] = [column_chunk_range(group.column(c)) for c in range(group.num_columns)]
        start = int(chunks[g, :, 0].min()) if group.num_columns else 0
        end = int((chunks[g, :, 0] + chunks[g, :, 1]).max()) if group.num_columns else 0
        groups[g] = (row, group.num_rows, start, end - start)
        row += group.num_rows
    schema = metadata.schema.to_arrow_schema()
    columns = [(field.name, str(field.type)) for field in schema]
    leaves = leaf_columns(schema)
    if len(leaves) != metadata.num_columns:  # a layout this does not know: whole row groups
        return FileLayout(name, "parquet", size, etag, groups, columns)
    return FileLayout(
        name, "parquet", size, etag, groups, columns, chunks=chunks, leaf_columns=leaves
    )


def column_chunk_range(chunk: Any) -> tuple[int, int]:
    """(byte offset, byte size) of one Parquet column chunk (its dictionary page first)."""
    first = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        first = min(first, chunk.dictionary_page_offset)
    return first, chunk.total_compressed_size


def leaf_columns(schema: Any) -> list[str]:
    """The top-level column of each Parquet leaf column, in file order (a struct, list or map
    column stores one column chunk per leaf). Column names may contain dots, so this counts
    leaves in the Arrow schema instead of splitting ``path_in_schema``."""
    return [field.name for field in schema for _ in range(_leaf_count(field.type))]


def _leaf_count(arrow_type: Any) -> int:
    types = require_pyarrow().types
    if types.is_struct(arrow_type):
        return sum(_leaf_count(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if types.is_map(arrow_type):
        return _leaf_count(arrow_type.key_type) + _leaf_count(arrow_type.item_type)
    if types.is_list(arrow_type) or types.is_large_list(arrow_type):
        return _leaf_count(arrow_type.value_type)
    if types.is_fixed_size_list(arrow_type):
        return _leaf_count(arrow_type.value_type)
    return 1


def _scan_arrow(path: str, name: str, size: int, etag: str) -> FileLayout:
    """Message offsets from one pass over the stream (the file format's stream starts at byte
    8); row counts from pyarrow's reader. Dictionaries must come before the first batch."""
    pa = require_pyarrow()
    local = epath.local_copy(path)
    with pa.memory_map(local) as source:
        start = 8 if source.read(6) == b"ARROW1" else 0
        source.seek(start)
        reader = pa.ipc.MessageReader.open_stream(source)
        spans, prelude_end = [], None
        while True:
            position = source.tell()
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message.type == "record batch":
                prelude_end = position if prelude_end is None else prelude_end
                spans.append((position, source.tell() - position))
            elif message.type == "dictionary" and prelude_end is not None:
                raise ParquetFormatError(
                    f"{path}: a dictionary message follows a record batch (delta or replaced "
                    "dictionaries); rewrite the file with its dictionaries first, or as Parquet"
                )
        source.seek(0)
        opened = pa.ipc.open_file(source) if start == 8 else pa.ipc.open_stream(source)
        schema = opened.schema
        counts = _arrow_batch_rows(opened, start == 8)
    if len(counts) != len(spans):
        raise ParquetFormatError(f"{path}: {len(spans)} record batch messages, {len(counts)} read")
    groups = np.zeros((len(spans), 4), dtype=np.int64)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts else []
    for g, ((offset, length), rows, first) in enumerate(zip(spans, counts, firsts)):
        groups[g] = (first, rows, offset, length)
    prelude = (start, prelude_end if prelude_end is not None else start)
    columns = [(field.name, str(field.type)) for field in schema]
    return FileLayout(name, "arrow", size, etag, groups, columns, prelude)


def _arrow_batch_rows(opened: Any, file_format: bool) -> list[int]:
    if file_format:
        return [opened.get_batch(i).num_rows for i in range(opened.num_record_batches)]
    return [batch.num_rows for batch in opened]


def read_column(path: str, fmt: str, column: str) -> list[Any]:
    """All values of one column of a Parquet or Arrow file, in row order (only that column's
    chunks are read from a Parquet file; an Arrow file is memory-mapped)."""
    pa = require_pyarrow()
    local = epath.local_copy(path)
    if fmt == "parquet":
        return pa.parquet.read_table(local, columns=[column]).column(column).to_pylist()
    with pa.memory_map(local) as source:
        is_file = source.read(6) == b"ARROW1"
        source.seek(0)
        opened = pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)
        return opened.read_all().column(column).to_pylist()


def row_keys(path: str, fmt: str, name: str, rows: int, key_column: str | None) -> list[str]:
    """Every row's ``__key__``: the key column's values, else ``<file>/<row>``. An empty key is
    an error naming the file and row (a key identifies a row in joins and excludes)."""
    if key_column is None:
        return [f"{name}/{row}" for row in range(rows)]
    values = read_column(path, fmt, key_column)
    empty = next((row for row, value in enumerate(values) if value is None), None)
    if empty is not None:
        raise ParquetFormatError(f"{path}: row {empty} has no key (column {key_column!r} is null)")
    return [str(value) for value in values]


def key_column_of(root: str, dataset_config: str) -> str | None:
    """The ``key_column`` that ``.nv-meta/<dataset_config>`` names, if any."""
    import yaml

    path = epath.join(root, MAIN_FOLDER_NAME, dataset_config)
    if not epath.is_file(path):
        return None
    data = yaml.safe_load(epath.read_text(path))
    column = data.get("key_column") if isinstance(data, dict) else None
    return None if column is None else str(column)


# ---------------------------------------------------------------------------------------------
# Discovering files


def discover_table_files(root: str, exclude: str | None = None) -> list[str]:
    """Parquet and Arrow files below ``root`` (relative POSIX paths, sorted; ``.nv-meta`` and
    hidden files skipped). ``exclude``: a regular expression (``re.search``) of paths to leave out."""
    exclude_re = re.compile(exclude) if exclude else None
    root = epath.normalize(root)
    prefix = root.rstrip("/") + "/" if epath.is_remote(root) else root + os.sep
    found = []
    for path in epath.walk(root):
        rel = path[len(prefix) :].replace(os.sep, "/")
        if rel.startswith(f"{MAIN_FOLDER_NAME}/") or any(p.startswith(".") for p in rel.split("/")):
            continue
        if table_format(rel) is None or (exclude_re is not None and exclude_re.search(rel)):
            continue
        found.append(rel)
    return sorted(found)


def scan_files(root: str, names: Sequence[str], *, progress: bool = False) -> list[FileLayout]:
    """Layouts of ``names`` (below ``root``), read in parallel. Every damaged file is found
    before this fails: the error counts them and names each with its reason."""
    from tqdm import tqdm

    def one(name: str) -> FileLayout | ParquetFormatError:
        try:
            return scan_file(epath.join(root, name), name)
        except ParquetFormatError as e:
            return e

    workers = min(16, max(1, len(names)))
    with ThreadPoolExecutor(workers) as pool:
        results = list(
            tqdm(pool.map(one, names), total=len(names), desc="Files", disable=not progress)
        )
    damaged = [r for r in results if isinstance(r, ParquetFormatError)]
    if damaged:
        shown = "; ".join(str(e) for e in damaged[:10])
        more = f" (and {len(damaged) - 10} more)" if len(damaged) > 10 else ""
        raise ParquetFormatError(
            f"{len(damaged)} of {len(names)} files are damaged: {shown}{more}. Replace them, or "
            "leave them out with --exclude"
        )
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# The prepared index


@dataclasses.dataclass
class ParquetIndex:
    """A prepared dataset's ``parquet.json`` and row-group table (memory-mapped)."""

    root: str
    files: list[dict[str, Any]]
    columns: list[tuple[str, str]]
    energon_version: str | None
    table_path: str  # the row-group table (a local file; for remote datasets a cached copy)
    chunks_path: str | None = None  # the column-chunk table (None: prepared without one)
    leaf_columns: list[str] | None = None  # top-level column of each leaf column

    @property
    def group_starts(self) -> np.ndarray:
        """Index of each file's first row group in the table, plus the total."""
        counts = [int(f["row_groups"]) for f in self.files]
        return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])

    def table(self) -> np.ndarray:
        return np.load(self.table_path, mmap_mode="r")


def info_path(root: str) -> str:
    return epath.join(root, MAIN_FOLDER_NAME, PARQUET_INFO_FILENAME)


def is_prepared_parquet(root: str) -> bool:
    return epath.is_file(info_path(root))


def read_parquet_index(root: str) -> ParquetIndex:
    """Read ``parquet.json`` and locate the row-group table; a damaged index is an error that
    says to prepare again."""
    path = info_path(root)
    try:
        data = json.loads(epath.read_text(path))
        if data.get("format") != INFO_FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {INFO_FORMAT!r}")
        files = list(data["files"])
        columns = [(str(n), str(t)) for n, t in data["columns"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ParquetFormatError(f"{path}: damaged ({e}); run `energon prepare {root}`") from e
    table_path = epath.local_copy(epath.join(root, MAIN_FOLDER_NAME, ROW_GROUPS_FILENAME))
    index = ParquetIndex(root, files, columns, data.get("energon_version"), table_path)
    table = index.table()
    if table.ndim != 2 or table.shape[1] != 5 or len(table) != int(index.group_starts[-1]):
        raise ParquetFormatError(
            f"{table_path}: the row-group table does not match {path}; run `energon prepare {root}`"
        )
    leaves = data.get("leaf_columns")
    if leaves is not None:  # prepared with the column-chunk table
        index.leaf_columns = [str(c) for c in leaves]
        index.chunks_path = epath.local_copy(epath.join(root, MAIN_FOLDER_NAME, CHUNKS_FILENAME))
        chunks = np.load(index.chunks_path, mmap_mode="r")
        if chunks.shape != (len(table), len(leaves), 2):
            raise ParquetFormatError(
                f"{index.chunks_path}: the column-chunk table does not match {path}; run "
                f"`energon prepare {root}`"
            )
    return index


def row_group_table(layouts: Sequence[FileLayout]) -> np.ndarray:
    """The ``.npy`` table of :data:`ROW_GROUPS_FILENAME` for files in this order."""
    parts = [
        np.concatenate([np.full((len(f.groups), 1), i, dtype=np.int64), f.groups], axis=1)
        for i, f in enumerate(layouts)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 5), dtype=np.int64)


def column_chunk_table(layouts: Sequence[FileLayout]) -> np.ndarray | None:
    """The ``.npy`` table of :data:`CHUNKS_FILENAME` (rows as in the row-group table; ``-1`` for
    Arrow files), or None when no file is Parquet."""
    leaves = next((f.chunks.shape[1] for f in layouts if f.chunks is not None), None)
    if leaves is None or any(f.format == "parquet" and f.chunks is None for f in layouts):
        return None
    parts = [
        f.chunks if f.chunks is not None else np.full((len(f.groups), leaves, 2), -1, np.int64)
        for f in layouts
    ]
    return np.concatenate(parts).astype(np.int64)


def write_parquet_index(
    root: str,
    layouts: Sequence[FileLayout],
    split_parts: dict[str, list[str]],
    *,
    split_config: str = SPLIT_YAML_FILENAME,
    before_info: Callable[[], None] | None = None,
) -> None:
    """Write the index files; ``parquet.json`` last, after ``before_info()`` (the CLI writes
    ``dataset.yaml`` there), so a killed run never leaves a dataset that looks prepared without
    the rest. Each file is written atomically (temporary file or object, then renamed)."""
    from energon.format.info import current_energon_version

    meta = epath.join(root, MAIN_FOLDER_NAME)
    buffer = io.BytesIO()
    np.save(buffer, row_group_table(layouts), allow_pickle=False)
    epath.write_bytes(epath.join(meta, ROW_GROUPS_FILENAME), buffer.getvalue())
    chunks = column_chunk_table(layouts)
    if chunks is not None:
        buffer = io.BytesIO()
        np.save(buffer, chunks, allow_pickle=False)
        epath.write_bytes(epath.join(meta, CHUNKS_FILENAME), buffer.getvalue())
    split_text = split_config_text(split_parts)
    epath.write_bytes(epath.join(meta, split_config), split_text.encode())
    epath.write_bytes(epath.join(meta, INDEX_UUID_FILENAME), str(uuid.uuid4()).encode())
    if before_info is not None:
        before_info()
    columns = layouts[0].columns if layouts else []
    info = {
        "format": INFO_FORMAT,
        "version": INFO_VERSION,
        "energon_version": current_energon_version(),
        "columns": [list(c) for c in columns],
        "files": [f.info() for f in layouts],
    }
    if chunks is not None:
        info["leaf_columns"] = next(f.leaf_columns for f in layouts if f.chunks is not None)
    epath.write_bytes(info_path(root), json.dumps(info, indent=1).encode())


def check_same_columns(layouts: Sequence[FileLayout]) -> None:
    """Every file must have the first file's columns (names and types)."""
    if not layouts:
        return
    first = layouts[0]
    for other in layouts[1:]:
        if other.columns != first.columns:
            raise ParquetFormatError(
                f"{other.name}: its columns {other.columns} differ from those of {first.name} "
                f"({first.columns}); a dataset's files must share one schema"
            )


# ---------------------------------------------------------------------------------------------
# Preparing a folder


@dataclasses.dataclass
class ParquetPrepareResult:
    """What ``prepare_parquet`` found (the CLI prints it and proposes a ``dataset.yaml``)."""

    layouts: list[FileLayout]
    split_parts: dict[str, list[str]]

    @property
    def shard_counts(self) -> dict[str, int]:
        return {f.name: f.rows for f in self.layouts}

    @property
    def total_rows(self) -> int:
        return sum(f.rows for f in self.layouts)

    @property
    def columns(self) -> list[tuple[str, str]]:
        return self.layouts[0].columns if self.layouts else []

    @property
    def row_groups(self) -> int:
        return sum(len(f.groups) for f in self.layouts)

    @property
    def largest_row_group_bytes(self) -> int:
        return max((int(f.groups[:, 3].max()) for f in self.layouts if len(f.groups)), default=0)


def prepare_parquet(
    root: str | os.PathLike,
    files: Sequence[str] | None = None,
    *,
    split_parts_ratio: Sequence[tuple[str, float]] | None = None,
    split_parts_patterns: Sequence[tuple[str, str]] | None = None,
    shuffle_seed: int | None = None,
    exclude: str | None = None,
    split_config: str = SPLIT_YAML_FILENAME,
    progress: bool = True,
    before_info: Callable[[ParquetPrepareResult], None] | None = None,
) -> ParquetPrepareResult:
    """Index the Parquet/Arrow files of the dataset at ``root`` (a folder or an object-storage
    prefix) and write its ``.nv-meta``: reads only footers (Arrow: message headers).

    ``files``: relative paths (default: every Parquet/Arrow file below ``root`` that ``exclude``
    does not match). Splits assign whole files, as ``prepare`` assigns shards: by
    ``split_parts_patterns`` (regular expressions), else by ``split_parts_ratio`` (default: all in
    ``train``). ``before_info(result)`` runs before the marker file is written. Damaged files are
    all found and named before anything is written (:class:`ParquetFormatError`).
    """
    from energon.format.layout import nv_meta_dir, prepare_lock
    from energon.format.split import split_by_patterns, split_by_ratio

    root = epath.normalize(root)
    names = list(files) if files is not None else discover_table_files(root, exclude)
    if not names:
        raise ParquetFormatError(f"{root}: no Parquet or Arrow files found")
    layouts = scan_files(root, names, progress=progress)
    check_same_columns(layouts)
    if split_parts_patterns:
        split_parts = split_by_patterns(names, split_parts_patterns)
    else:
        split_parts = split_by_ratio(names, split_parts_ratio or [("train", 1.0)], shuffle_seed)
    result = ParquetPrepareResult(layouts, split_parts)

    def write() -> None:
        write_parquet_index(
            root,
            layouts,
            split_parts,
            split_config=split_config,
            before_info=(lambda: before_info(result)) if before_info is not None else None,
        )

    if epath.is_remote(root):
        write()
    else:
        nv_meta_dir(root).mkdir(exist_ok=True)
        with prepare_lock(root):
            write()
    return result
