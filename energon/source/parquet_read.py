"""Reading rows of Parquet and Arrow files by row group, within a memory budget.

A reader never decodes single rows: it decodes a *window* (a whole row group, or a run of its
rows) of the wanted columns only, keeps it, and serves the following rows from it. All bytes come
through the process's :func:`~energon.source.shard_reader.shard_reader` (pread locally; ranged GETs
remotely, of the prefetched column chunks of the wanted columns, see :func:`coalesce_ranges`), so
object storage is read by byte range and never downloaded whole.

Memory (per process; ``ENERGON_PARQUET_READ_BUDGET`` bytes, default 256 MiB, sets ``budget``):

- decoded windows kept for the next rows: at most ``budget / 2`` (least recently used go first);
- one window: at most ``budget / 16``, estimated from the footer (the row group's decoded size of
  the wanted columns, per row), never less than one row. A row group within that is read whole;
  a larger one is read in windows of that many rows, streamed from the row group's start. Decoding
  a window needs about 2.5 times its size for a moment;
- an open stream (at most ``MAX_CURSORS``) holds a 64 KiB read buffer and the current data page
  per column, and the column's dictionary page while it has one. Parquet cannot decode less than
  a page: pyarrow's writer makes pages of up to 1024 rows and dictionary pages of up to 1 MiB by
  default, so files with large values hold that much more per stream (docs/parquet.md);
- an Arrow record batch is read whole (its bytes, then zero-copy columns): a dataset whose largest
  batch exceeds ``budget / 2`` is refused when it is opened, naming the file and batch.

So ``budget`` bounds the decoded data, and the remote chunk cache (``ENERGON_REMOTE_PREFETCH_BUDGET``)
the raw bytes in flight. Reading rows from the middle of a row group larger than a window costs
decoding (not keeping) the rows before them: keep row groups small (docs/parquet.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from energon.errors import DamagedSampleError, SampleReadError
from energon.format.parquet import RangedFile, leaf_columns, require_pyarrow
from energon.source.shard_reader import ByteIndex, shard_reader

READ_BUDGET = int(os.environ.get("ENERGON_PARQUET_READ_BUDGET", 256 << 20))
WINDOW_SHARE = 16  # a window holds at most budget / WINDOW_SHARE
MAX_CURSORS = 4  # open streams through row groups larger than a window
STREAM_BUFFER = 64 << 10  # pyarrow's read buffer per column of a stream
MAX_FILES = 32  # open files (footers) per process
# remote: column chunks this close together are fetched in one request, gap included
HOLE_BYTES = int(os.environ.get("ENERGON_PARQUET_HOLE_BYTES", 64 << 10))


@dataclasses.dataclass(frozen=True)
class FileRef:
    """What a reader needs to know about one file (from the dataset's index)."""

    path: str
    format: str  # "parquet" | "arrow"
    size: int
    groups: Any  # int64 [row groups, 4]: first row, rows, byte offset, byte size
    prelude: tuple[int, int] = (0, 0)  # Arrow: the schema (and dictionary) messages
    index: Callable[[str], ByteIndex] | None = None  # row-group byte boundaries (prefetching)

    def where(self, group: int) -> str:
        return f"{self.path} row group {group}"


@dataclasses.dataclass
class Window:
    """Rows ``[start, end)`` of one row group, the wanted columns decoded."""

    start: int
    end: int
    columns: dict[str, Any]  # name -> pyarrow Array
    nbytes: int


class _Cursor:
    """A stream through one row group in windows of ``rows`` rows."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self.batches = batches
        self.next_row = 0


class TableReader:
    """Rows of Parquet/Arrow files by (file, row group, row); one per process (see module doc)."""

    def __init__(self, budget: int = READ_BUDGET) -> None:
        self.budget = budget
        self._lock = threading.RLock()
        self._windows: OrderedDict[tuple, Window] = OrderedDict()  # LRU
        self._starts: dict[tuple, list[int]] = {}  # (path, group, columns) -> window starts
        self._bytes = 0
        self._files: OrderedDict[str, Any] = OrderedDict()  # path -> pyarrow ParquetFile / schema
        self._cursors: OrderedDict[tuple, list[_Cursor]] = OrderedDict()
        self._failed: OrderedDict[tuple, str] = OrderedDict()  # (path, group) -> why

    @property
    def window_limit(self) -> int:
        return max(1, self.budget // WINDOW_SHARE)

    def window(
        self, file: FileRef, group: int, row: int, columns: tuple[str, ...] | None
    ) -> Window:
        """The decoded window that holds ``row`` of row group ``group``; a damaged row group (or
        a file that changed since it was indexed) is a :class:`DamagedSampleError`."""
        with self._lock:
            failed = self._failed.get((file.path, group))
            if failed is not None:
                raise DamagedSampleError(file.path, int(file.groups[group][2]), failed)
            found = self._cached(file.path, group, columns, row)
            if found is not None:
                return found
            try:
                return self._read(file, group, row, columns)
            except (DamagedSampleError, SampleReadError):
                raise
            except Exception as e:
                if not _is_data_error(e):
                    raise
                why = f"row group {group} cannot be read: {type(e).__name__}: {e}"
                self._failed[(file.path, group)] = why
                if len(self._failed) > 256:
                    self._failed.popitem(last=False)
                raise DamagedSampleError(file.path, int(file.groups[group][2]), why) from e

    # -- the cache of windows ------------------------------------------------------------------

    def _cached(self, path: str, group: int, columns: Any, row: int) -> Window | None:
        starts = self._starts.get((path, group, columns))
        if not starts:
            return None
        i = bisect.bisect_right(starts, row) - 1
        if i < 0:
            return None
        key = (path, group, columns, starts[i])
        window = self._windows[key]
        if row >= window.end:
            return None
        self._windows.move_to_end(key)
        return window

    def _keep(self, path: str, group: int, columns: Any, window: Window) -> Window:
        key = (path, group, columns, window.start)
        if key in self._windows:
            return self._windows[key]
        while self._windows and self._bytes + window.nbytes > self.budget // 2:
            old_key, old = self._windows.popitem(last=False)
            self._bytes -= old.nbytes
            starts = self._starts[old_key[:3]]
            del starts[bisect.bisect_left(starts, old_key[3])]
        self._windows[key] = window
        self._bytes += window.nbytes
        bisect.insort(self._starts.setdefault(key[:3], []), window.start)
        return window

    # -- reading -------------------------------------------------------------------------------

    def _read(self, file: FileRef, group: int, row: int, columns: Any) -> Window:
        if file.format == "arrow":
            return self._keep(file.path, group, columns, self._arrow_batch(file, group, columns))
        handle = self._parquet(file)
        leaves = leaf_columns(handle.schema_arrow)
        rows_per_window = self._rows_per_window(handle.metadata.row_group(group), leaves, columns)
        rows = int(file.groups[group][1])
        if rows_per_window >= rows:
            table = handle.read_row_group(group, columns=_names(columns), use_threads=False)
            return self._keep(file.path, group, columns, _window(0, table))
        return self._stream_to(file, group, row, columns, rows_per_window)

    def _rows_per_window(self, group_meta: Any, leaves: list[str], columns: Any) -> int:
        """Rows of one window: the row group's estimated decoded size (footer) per row.
        ``leaves``: the top-level column of each leaf column."""
        wanted = None if columns is None else set(columns)
        size = 0
        for c in range(group_meta.num_columns):
            if wanted is None or c >= len(leaves) or leaves[c] in wanted:
                size += group_meta.column(c).total_uncompressed_size
        rows = max(1, group_meta.num_rows)
        if size <= self.window_limit:
            return rows
        return max(1, rows * self.window_limit // size)

    def _stream_to(
        self, file: FileRef, group: int, row: int, columns: Any, rows_per_window: int
    ) -> Window:
        """Advance the open stream nearest before ``row`` (or a new one) to the window of ``row``;
        the windows it passes are decoded and dropped."""
        key = (file.path, group, columns)
        cursors = self._cursors.setdefault(key, [])
        self._cursors.move_to_end(key)
        behind = [c for c in cursors if c.next_row <= row]
        if behind:
            cursor = max(behind, key=lambda c: c.next_row)
        else:
            handle = self._parquet(file, streaming=True)
            batches = handle.iter_batches(
                batch_size=rows_per_window,
                row_groups=[group],
                columns=_names(columns),
                use_threads=False,
            )
            cursor = _Cursor(iter(batches))
            cursors.append(cursor)
            self._limit_cursors()
        for batch in cursor.batches:
            start = cursor.next_row
            cursor.next_row += batch.num_rows
            if cursor.next_row > row:
                return self._keep(file.path, group, columns, _window(start, batch))
        cursors.remove(cursor)
        raise DamagedSampleError(
            file.path,
            int(file.groups[group][2]),
            f"row group {group} ended after {cursor.next_row} rows; row {row} was indexed",
        )

    def _limit_cursors(self) -> None:
        while sum(len(c) for c in self._cursors.values()) > MAX_CURSORS:
            key, cursors = next(iter(self._cursors.items()))
            cursors.pop(0)
            if not cursors:
                del self._cursors[key]

    def _parquet(self, file: FileRef, streaming: bool = False) -> Any:
        """The file's pyarrow ParquetFile (footer read once per process and checked against the
        index); ``streaming``: one that reads column chunks in small buffered pieces."""
        pq = require_pyarrow().parquet
        key = file.path + ("\0stream" if streaming else "")
        handle = self._files.get(key)
        if handle is not None:
            self._files.move_to_end(key)
            return handle
        metadata = None
        if streaming:
            metadata = self._parquet(file).metadata
        source = RangedFile(_reader_of(file), file.size, file.path)
        handle = pq.ParquetFile(
            source,
            metadata=metadata,
            pre_buffer=False,
            buffer_size=STREAM_BUFFER if streaming else 0,
        )
        if not streaming:
            _check_groups(file, handle.metadata)
        self._files[key] = handle
        if len(self._files) > MAX_FILES:
            self._files.popitem(last=False)
        return handle

    def _arrow_batch(self, file: FileRef, group: int, columns: Any) -> Window:
        pa = require_pyarrow()
        schema, prelude = self._arrow_schema(file)
        _, rows, offset, size = (int(v) for v in file.groups[group])
        data = _reader_of(file)(offset, offset + size)
        if prelude is None:
            batch = pa.ipc.read_record_batch(pa.py_buffer(data), schema)
        else:  # dictionary-encoded columns: read the dictionaries with the batch
            batch = pa.ipc.open_stream(pa.py_buffer(prelude + data)).read_next_batch()
        if batch.num_rows != rows:
            raise DamagedSampleError(
                file.path, offset, f"record batch {group} has {batch.num_rows} rows, {rows} indexed"
            )
        if columns is not None:
            batch = batch.select(list(columns))
        return _window(0, batch)

    def _arrow_schema(self, file: FileRef) -> tuple[Any, bytes | None]:
        """(schema, None) of an Arrow file; (schema, prelude bytes) when it has dictionaries."""
        found = self._files.get(file.path)
        if found is not None:
            return found
        pa = require_pyarrow()
        start, end = file.prelude
        prelude = _reader_of(file)(start, end)
        schema = pa.ipc.open_stream(pa.py_buffer(prelude + b"\xff\xff\xff\xff\0\0\0\0")).schema
        has_dictionaries = any(pa.types.is_dictionary(field.type) for field in schema)
        found = (schema, prelude if has_dictionaries else None)
        self._files[file.path] = found
        if len(self._files) > MAX_FILES:
            self._files.popitem(last=False)
        return found


def coalesce_ranges(ranges: Any, hole: int, limit: int) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` (any order) as few requests: sorted, merged across gaps of at
    most ``hole`` bytes while a request stays within ``limit`` bytes (a larger range stays
    whole). Why: a request costs a round trip, a small gap costs less than one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted((int(a), int(b)) for a, b in ranges):
        if merged and start - merged[-1][1] <= hole and end - merged[-1][0] <= limit:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _names(columns: tuple[str, ...] | None) -> list[str] | None:
    return None if columns is None else list(columns)


def _window(start: int, table: Any) -> Window:
    """A window over a pyarrow Table or RecordBatch (one contiguous array per column)."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if hasattr(column, "combine_chunks"):
            column = column.combine_chunks()
        columns[name] = column
    return Window(start, start + table.num_rows, columns, int(table.nbytes))


def _reader_of(file: FileRef) -> Callable[[int, int], bytes]:
    reader = shard_reader()
    path, index = file.path, file.index

    def read(start: int, end: int) -> bytes:
        return reader.read(path, start, end, index)

    return read


def _check_groups(file: FileRef, metadata: Any) -> None:
    """The footer must describe the row groups the index holds, else the file changed."""
    counts = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    indexed = [int(r) for r in file.groups[:, 1]]
    if counts != indexed:
        raise DamagedSampleError(
            file.path,
            0,
            f"the file changed since it was indexed ({len(counts)} row groups of "
            f"{sum(counts)} rows, {len(indexed)} of {sum(indexed)} indexed): prepare it again",
        )


def _is_data_error(e: BaseException) -> bool:
    """pyarrow's errors for bad bytes (and short reads), not programming errors."""
    pa = require_pyarrow()
    return isinstance(e, (pa.ArrowException, OSError, EOFError))


_reader: TableReader | None = None
_pid = -1


def table_reader() -> TableReader:
    """The process-wide reader (a fresh one after a fork)."""
    global _reader, _pid
    if _reader is None or _pid != os.getpid():
        _reader, _pid = TableReader(), os.getpid()
    return _reader


def reset_table_reader(budget: int | None = None) -> None:
    """Forget open files and decoded windows (tests; after data changed in place)."""
    global _reader, _pid
    _reader, _pid = TableReader(READ_BUDGET if budget is None else budget), os.getpid()
