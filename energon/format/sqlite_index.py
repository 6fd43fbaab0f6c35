"""``.nv-meta/index.sqlite``: every sample's and every part's byte range, for random access by key.

The schema is the reference's (F8) so either tool can read the other's index. ``index.uuid`` is a
fresh random UUID whenever new rows were written; join indices use it to notice a rebuilt index.

The writer is meant for a database that nobody reads yet (``prepare`` builds it in its work
folder and renames it into place), so it can switch off fsync while filling it: a ``kill -9``
loses nothing the operating system was given, and the rollback journal undoes the chunk that
was being added (a chunk database has no journal at all: a killed chunk is scanned again).
"""

from __future__ import annotations

import contextlib
import operator
import os
import sqlite3
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain, repeat
from pathlib import Path

from energon import epath
from energon.errors import DuplicateSampleKeyError, SampleTablesMissingError
from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    INDEX_UUID_FILENAME,
    MAIN_FOLDER_NAME,
    PathLike,
    atomic_write_text,
    nv_meta_dir,
)

SAMPLE_SCHEMA = (
    """CREATE TABLE samples (
    tar_file_id INTEGER NOT NULL,
    sample_key TEXT NOT NULL UNIQUE,
    sample_index INTEGER NOT NULL,
    byte_offset INTEGER,
    byte_size INTEGER
)""",
    """CREATE TABLE sample_parts (
    tar_file_id INTEGER,
    sample_index INTEGER,
    part_name TEXT,
    content_byte_offset INTEGER,
    content_byte_size INTEGER
)""",
)

MEDIA_SCHEMA = (
    """CREATE TABLE media_metadata (
    entry_key TEXT PRIMARY KEY,
    metadata_type TEXT NOT NULL,
    metadata_json TEXT NOT NULL
)""",
    """CREATE TABLE media_filters (
    filter_id INTEGER PRIMARY KEY AUTOINCREMENT,
    strategy TEXT NOT NULL,
    patterns TEXT,
    created_at_utc TEXT DEFAULT CURRENT_TIMESTAMP,
    UNIQUE(strategy, patterns)
)""",
)

SCHEMA = SAMPLE_SCHEMA + MEDIA_SCHEMA

INDEXES = (
    "CREATE INDEX IF NOT EXISTS idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_seq "
    "ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX IF NOT EXISTS idx_sample_parts_full "
    "ON sample_parts(tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)",
)

_MEDIA_TABLES = ("media_metadata", "media_filters")
CACHE_KIB = 65536  # sqlite's page cache while writing: a constant, whatever the dataset's size


#: ``(entry_key, metadata_type, metadata_json)``
MediaRow = tuple[str, str, str]


def replace_media_rows(db: sqlite3.Connection, rows: Iterable[MediaRow]) -> int:
    """Insert or overwrite rows; returns how many were written."""
    rows = list(rows)
    db.executemany(
        "INSERT OR REPLACE INTO media_metadata (entry_key, metadata_type, metadata_json) "
        "VALUES (?, ?, ?)",
        rows,
    )
    return len(rows)


def record_media_filter(db: sqlite3.Connection, strategy: str, patterns: str) -> None:
    """Remember how the metadata was selected (one row per distinct filter)."""
    db.execute(
        "INSERT OR IGNORE INTO media_filters (strategy, patterns) VALUES (?, ?)",
        (strategy, patterns),
    )


ROWS_PER_INSERT = 64


def insert_rows(db: sqlite3.Connection, table: str, width: int, rows: Iterable[tuple]) -> None:
    """Insert ``rows`` (of ``width`` values) in order, ``ROWS_PER_INSERT`` rows per statement.

    sqlite's fixed work per statement (a step and a reset, each taking the connection's lock)
    costs more than binding a row's values: one row per statement (``executemany`` of a
    one-row ``INSERT``) is about twice as slow per row. Rows keep their order, so their
    ``rowid`` is the same as with one row per statement.
    """
    flat = list(chain.from_iterable(rows))
    step = ROWS_PER_INSERT * width
    whole = len(flat) // step * step
    if whole:
        many = _insert_sql(table, width, ROWS_PER_INSERT)
        db.executemany(many, (flat[i : i + step] for i in range(0, whole, step)))
    if whole < len(flat):
        db.execute(_insert_sql(table, width, (len(flat) - whole) // width), flat[whole:])


def _insert_sql(table: str, width: int, rows: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return f"INSERT INTO {table} VALUES " + ", ".join([one] * rows)


class SqliteIndexWriter:
    """Fills a new ``index.sqlite`` from the chunk databases of a ``prepare`` (:meth:`add_chunk`),
    or a chunk database shard by shard (``chunk=True``, :meth:`add_shard`).

    ``shard_names`` (by ``tar_file_id``: a list, or a mapping for some of them) are only used to
    name both places of a duplicate key.

    **The key index.** The reference's schema makes ``sample_key`` ``UNIQUE``, so sqlite keeps an
    index of every key while rows come in. Rows come in shard and sample order: when the keys
    grow with that order (numbered samples), each key lands at the index's end, which is cheap;
    when they do not (hashed names), each lands at a random page, and once the index outgrows
    the page cache every row costs a random read (12-13 us per sample past a few million, hours
    at a billion). So the first chunk decides: keys in ascending order keep the index up as rows
    come in; keys in any other order fill the table without it, and :meth:`close` builds it in
    one sort (1-2 us per sample, in sequential passes; a duplicate is then found at the end
    instead of at its chunk). Either way the file has the reference's schema, text included
    (unless the sqlite build refuses edits of the schema: see :meth:`_build_key_index`).
    """

    def __init__(
        self,
        db_path: PathLike,
        shard_names: Sequence[str] | Mapping[int, str] = (),
        *,
        chunk: bool = False,
    ) -> None:
        """``chunk``: a chunk database of a ``prepare`` (its rows go into the real index by
        :meth:`add_chunk`, whose key index finds duplicates): no key index of its own, no
        journal (a killed chunk is scanned again) and one transaction for all its shards.

        Otherwise ``db_path`` is the index being built: created, or continued where a killed
        run left it (each chunk is one transaction under a rollback journal, so a kill undoes
        at most the chunk being added; :attr:`rows_written` counts the rows it holds). The
        lookup indexes exist from the start and are kept up while rows come in (cheaper than
        building them at the end, as rows come sorted by shard and sample), except the key
        index (see the class docstring)."""
        self.db_path = Path(db_path)
        self.shard_names = (
            dict(shard_names) if isinstance(shard_names, Mapping) else dict(enumerate(shard_names))
        )
        self.rows_written = 0
        self.chunk = chunk
        self.key_index_at_end: bool | None = None  # decided by the first chunk (None: not yet)
        self._db = sqlite3.connect(self.db_path, isolation_level=None)
        # a journal costs little here: rows are appended, so few existing pages change
        self._db.execute(f"PRAGMA journal_mode={'OFF' if chunk else 'DELETE'}")
        self._db.execute("PRAGMA synchronous=OFF")  # a kill -9 loses nothing the OS was given
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute(f"PRAGMA cache_size={-CACHE_KIB}")
        if chunk:
            self._db.execute("BEGIN")
            self._db.execute(_without_key_index(SAMPLE_SCHEMA[0]))
            for statement in SCHEMA[1:]:
                self._db.execute(statement)
        elif self._table_sql("sample_parts") is None:
            self._create_schema()
        else:
            self._continue()

    def _table_sql(self, name: str) -> str | None:
        row = self._db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return None if row is None else row[0]

    def _create_schema(self) -> None:
        """Every table but ``samples`` (the first chunk decides its key index), with
        ``sample_parts``' indexes, in one transaction."""
        with self._transaction():
            for statement in SCHEMA[1:]:
                self._db.execute(statement)
            for statement in INDEXES[1:]:
                self._db.execute(statement)

    def _continue(self) -> None:
        """An index a killed run was building: how far it got and how its key index is made."""
        samples = self._table_sql("samples")
        if samples is not None:
            self.key_index_at_end = "UNIQUE" not in samples
            self.rows_written = self._db.execute("SELECT max(rowid) FROM samples").fetchone()[0]
            self.rows_written = self.rows_written or 0  # rows are appended, never removed

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # (sqlite ends it on its own after some errors)
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def add_shard(
        self,
        tar_file_id: int,
        keys: Sequence[str],
        offsets: Sequence[int],
        part_sample_index: Iterable[int],
        part_names: Iterable[str],
        part_offsets: Iterable[int],
        part_sizes: Iterable[int],
    ) -> None:
        """Insert one shard into a chunk database, given column-wise.

        ``offsets`` has ``len(keys) + 1`` entries (the ``.tar.idx``); the four part columns hold
        one entry per part. Rows are assembled by ``zip`` in C (building per-row tuples in Python
        would cost as much as the inserts themselves) and inserted by :func:`insert_rows`.
        """
        n = len(keys)
        byte_sizes = map(operator.sub, offsets[1:], offsets[:n])
        samples = zip(repeat(tar_file_id, n), keys, range(n), offsets[:n], byte_sizes)
        part_rows = zip(
            repeat(tar_file_id), part_sample_index, part_names, part_offsets, part_sizes
        )
        insert_rows(self._db, "samples", 5, samples)
        insert_rows(self._db, "sample_parts", 5, part_rows)
        self.rows_written += n

    def _location(self, tar_file_id: int, byte_offset: int) -> str:
        name = self.shard_names.get(tar_file_id, f"tar_file_id {tar_file_id}")
        return f"shard {name} at byte offset {byte_offset}"

    def add_chunk(self, chunk_db: PathLike) -> None:
        """Append the rows of a chunk database (same schema, global ``tar_file_id``), in their
        order, in one transaction; a key that an earlier row has is a
        :class:`DuplicateSampleKeyError` naming both places (at :meth:`close` when the key
        index is built there)."""
        db = self._db
        db.execute("ATTACH DATABASE ? AS chunk", (str(chunk_db),))
        try:
            with self._transaction():
                if self.key_index_at_end is None:
                    self._create_samples_table(key_index_at_end=not self._chunk_keys_ascend())
                try:
                    db.execute("INSERT INTO main.samples SELECT * FROM chunk.samples")
                except sqlite3.IntegrityError:
                    raise self._explain_chunk_duplicate() from None
                db.execute("INSERT INTO main.sample_parts SELECT * FROM chunk.sample_parts")
                db.execute(
                    "INSERT OR REPLACE INTO main.media_metadata SELECT * FROM chunk.media_metadata"
                )
            self.rows_written += db.execute("SELECT count(*) FROM chunk.samples").fetchone()[0]
        finally:
            db.execute("DETACH DATABASE chunk")

    def _chunk_keys_ascend(self) -> bool:
        """Whether the attached chunk's keys are in ascending order (row by row: a chunk's rows
        are numbered 1, 2, ... as they were inserted)."""
        row = self._db.execute(
            "SELECT 1 FROM chunk.samples a JOIN chunk.samples b ON b.rowid = a.rowid + 1 "
            "WHERE b.sample_key <= a.sample_key LIMIT 1"
        ).fetchone()
        return row is None

    def _create_samples_table(self, key_index_at_end: bool) -> None:
        self.key_index_at_end = key_index_at_end
        schema = SAMPLE_SCHEMA[0]
        self._db.execute(_without_key_index(schema) if key_index_at_end else schema)
        self._db.execute(INDEXES[0])

    def _explain_chunk_duplicate(self) -> DuplicateSampleKeyError:
        """The chunk's first row whose key came before: in an earlier chunk, or earlier in this
        one (the failed insert was undone, so the index holds only earlier chunks' rows)."""
        row = self._db.execute(
            "SELECT key, first_tar, first_offset, tar, offset FROM ("
            "SELECT c.rowid AS at, 0 AS before, c.sample_key AS key, m.tar_file_id AS first_tar, "
            "m.byte_offset AS first_offset, c.tar_file_id AS tar, c.byte_offset AS offset "
            "FROM chunk.samples c JOIN main.samples m ON m.sample_key = c.sample_key "
            "UNION ALL "
            "SELECT b.rowid, a.rowid, b.sample_key, a.tar_file_id, a.byte_offset, b.tar_file_id, "
            "b.byte_offset FROM chunk.samples b JOIN chunk.samples a "
            "ON a.sample_key = b.sample_key AND a.rowid < b.rowid"
            ") ORDER BY at, before LIMIT 1"
        ).fetchone()
        return self._duplicate_error(row)

    def _build_key_index(self) -> None:
        """The ``UNIQUE`` key index of the reference's schema, built in one sort."""
        with self._transaction():  # a kill undoes all of it: the next run builds it again
            try:
                with _sort_files_in(self.db_path.parent):
                    self._db.execute(
                        f"CREATE UNIQUE INDEX IF NOT EXISTS {_LATE_KEY_INDEX} ON samples(sample_key)"
                    )
            except sqlite3.IntegrityError:
                raise self._explain_late_duplicate() from None
            try:
                self._record_as_the_tables_own()
            except sqlite3.DatabaseError as e:  # an sqlite built to refuse schema edits
                warnings.warn(
                    f"{self.db_path}: the sample key index stays the unique index "
                    f"{_LATE_KEY_INDEX} ({e}); lookups and uniqueness are the same as with the "
                    "reference's UNIQUE column, only the schema text differs",
                    stacklevel=2,
                )

    def _record_as_the_tables_own(self) -> None:
        """Make the key index the one of the table's ``UNIQUE`` column.

        sqlite cannot add a constraint to a table, so the index was made as an ordinary unique
        index: the table's schema text gets its ``UNIQUE`` back and the index the name and empty
        text sqlite gives the index of a ``UNIQUE`` column. Both kinds of index hold the same
        entries (the key, then the rowid), so the file is what a table created with the
        constraint would be; ``PRAGMA integrity_check`` agrees (tests/prepare/test_key_index.py).
        One statement changes both entries: a refusal leaves the schema as it was.
        """
        db = self._db
        version = db.execute("PRAGMA schema_version").fetchone()[0]
        db.execute("PRAGMA writable_schema=ON")
        try:
            db.execute(
                "UPDATE sqlite_master SET sql = CASE type WHEN 'table' THEN ? ELSE NULL END, "
                "name = CASE type WHEN 'index' THEN ? ELSE name END "
                "WHERE (type = 'table' AND name = 'samples') OR (type = 'index' AND name = ?)",
                (SAMPLE_SCHEMA[0], _KEY_AUTOINDEX, _LATE_KEY_INDEX),
            )
            # other connections (and this one) must read the schema again
            db.execute(f"PRAGMA schema_version={version + 1}")
        finally:
            db.execute("PRAGMA writable_schema=OFF")

    def _explain_late_duplicate(self) -> DuplicateSampleKeyError:
        """The first row (in index order) whose key an earlier row has, and that earlier row."""
        row = self._db.execute(
            "SELECT b.sample_key, a.tar_file_id, a.byte_offset, b.tar_file_id, b.byte_offset "
            "FROM samples b JOIN samples a ON a.sample_key = b.sample_key AND a.rowid < b.rowid "
            "ORDER BY b.rowid, a.rowid LIMIT 1"
        ).fetchone()
        return self._duplicate_error(row)

    def _duplicate_error(self, row: tuple | None) -> DuplicateSampleKeyError:
        if row is None:
            return DuplicateSampleKeyError("?", "?", "?")
        key, first_id, first_offset, second_id, second_offset = row
        return DuplicateSampleKeyError(
            key, self._location(first_id, first_offset), self._location(second_id, second_offset)
        )

    def copy_media_tables_from(self, old_db_path: PathLike) -> None:
        """Carry media metadata over from a previous index (a re-prepare must not lose it)."""
        if not Path(old_db_path).is_file():
            return
        db = self._db
        db.execute("ATTACH DATABASE ? AS old", (str(old_db_path),))
        try:
            existing = {
                row[0]
                for row in db.execute("SELECT name FROM old.sqlite_master WHERE type = 'table'")
            }
            for table in _MEDIA_TABLES:
                if table in existing:
                    db.execute(f"INSERT OR IGNORE INTO main.{table} SELECT * FROM old.{table}")
        except sqlite3.DatabaseError:
            pass  # an unreadable old index has nothing worth keeping
        finally:
            db.execute("DETACH DATABASE old")

    def add_media_rows(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Media metadata rows ``(entry_key, metadata_type, metadata_json)`` (INSERT OR REPLACE)."""
        self._db.execute("SAVEPOINT media")
        replace_media_rows(self._db, rows)
        self._db.execute("RELEASE media")
        self.rows_written += len(rows)

    def add_media_filter(self, strategy: str, patterns: str) -> None:
        """Record the filter the media metadata was computed with."""
        record_media_filter(self._db, strategy, patterns)

    def close(self, on_progress: Callable[[], None] | None = None) -> None:
        """Finish the key index where it was left to the end, and close the database.

        ``on_progress`` is called now and then while the key index is built (a sort that can
        take minutes on a large index, with no count of its own to show)."""
        if self.chunk:
            self._db.execute("COMMIT")
        elif self.key_index_at_end is None:  # no chunk came: an empty index
            with self._transaction():
                self._create_samples_table(key_index_at_end=False)
        elif self.key_index_at_end:
            if on_progress is not None:

                def go_on() -> int:
                    on_progress()
                    return 0  # anything else would make sqlite abort the sort

                self._db.set_progress_handler(go_on, _PROGRESS_STEPS)
            try:
                self._build_key_index()
            finally:
                self._db.set_progress_handler(None, 0)
        self._db.close()

    def abort(self) -> None:
        self._db.close()


_PROGRESS_STEPS = 1 << 20  # sqlite virtual-machine steps between two on_progress calls
_LATE_KEY_INDEX = "samples_key_built_at_end"
_KEY_AUTOINDEX = "sqlite_autoindex_samples_1"  # sqlite's name for the samples' UNIQUE column


def _without_key_index(samples_schema: str) -> str:
    return samples_schema.replace("NOT NULL UNIQUE", "NOT NULL")


@contextlib.contextmanager
def _sort_files_in(folder: Path) -> Iterator[None]:
    """sqlite's sort spills to temporary files (about the keys' size, tens of GB at a billion
    samples): put them next to the index (``prepare --tmp-path`` chooses where), not in ``/tmp``.
    The setting is the process's, so the previous one comes back afterwards."""
    setting = sqlite3.connect(":memory:")
    try:
        before = setting.execute("PRAGMA temp_store_directory").fetchone()
        setting.execute(f"PRAGMA temp_store_directory = {_sql_text(str(folder))}")
        try:
            yield
        finally:
            setting.execute(
                f"PRAGMA temp_store_directory = {_sql_text(before[0] if before else '')}"
            )
    finally:
        setting.close()


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def write_index_uuid(root: PathLike, *, mode_like: PathLike | None = None) -> str:
    """Write a new random ``index.uuid`` (the index content changed) and return it."""
    value = str(uuid.uuid4())
    meta = nv_meta_dir(root)
    meta.mkdir(parents=True, exist_ok=True)
    atomic_write_text(meta / INDEX_UUID_FILENAME, value, mode_like=mode_like)
    return value


def read_index_uuid(root: PathLike) -> str:
    return (nv_meta_dir(root) / INDEX_UUID_FILENAME).read_text(encoding="utf-8").strip()


def _connect_read_only(db_path: PathLike) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)


def sample_key_at(db_path: PathLike, tar_file_id: int, sample_index: int) -> str | None:
    """The key of sample ``sample_index`` of shard ``tar_file_id`` (None: no such row)."""
    db = _connect_read_only(db_path)
    try:
        row = db.execute(
            "SELECT sample_key FROM samples WHERE tar_file_id=? AND sample_index=?",
            (tar_file_id, sample_index),
        ).fetchone()
    finally:
        db.close()
    return row[0] if row is not None else None


def sample_indices_of(db_path: PathLike, wanted: Iterable[tuple[int, str]]) -> list[int | None]:
    """For each ``(tar_file_id, sample key)``: the sample's index in its shard (None: not there)."""
    db = _connect_read_only(db_path)
    try:
        found = []
        for tar_file_id, key in wanted:
            row = db.execute(
                "SELECT sample_index FROM samples WHERE tar_file_id=? AND sample_key=?",
                (tar_file_id, key),
            ).fetchone()
            found.append(None if row is None else int(row[0]))
    finally:
        db.close()
    return found


def sample_tables_path(root: str, needed_by: str) -> str:
    """The local path of the dataset's ``index.sqlite`` (remote: a validated local copy), or a
    :class:`SampleTablesMissingError` saying who needs it and how to build it."""
    url = epath.join(root, MAIN_FOLDER_NAME, INDEX_SQLITE_FILENAME)
    try:
        if epath.is_remote(url):
            return epath.local_copy(url)
        if os.path.isfile(url):
            return url
    except FileNotFoundError:
        pass
    raise SampleTablesMissingError(
        f"{root} has no sample tables ({MAIN_FOLDER_NAME}/{INDEX_SQLITE_FILENAME} does not exist: "
        f"prepared with --no-sample-tables?), which {needed_by} needs: build them with "
        f"`energon prepare --tar-index-only {root}`"
    )
