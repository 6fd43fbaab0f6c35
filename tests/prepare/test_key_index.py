"""The ``UNIQUE`` key index of ``index.sqlite``: kept up while rows come in when the keys ascend,
built in one sort at the end when they do not (hashed names). Either way the file must be what the
reference's schema makes (text included), sound (``PRAGMA integrity_check``), find every key, and
refuse a duplicate naming both places."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from energon.errors import DuplicateSampleKeyError
from energon.format import sqlite_index
from energon.format.info import has_info
from energon.format.sqlite_index import SqliteIndexWriter
from energon.prepare.dataset import prepare_dataset
from tests.helpers.tarfiles import write_tar

PER_SHARD = 7


def _hashed(n: int) -> str:
    return hashlib.md5(b"%d" % n).hexdigest()[:16]


def _numbered(n: int) -> str:
    return f"{n:06d}"


def _write_shards(root: Path, key_of, shards: int = 5) -> Path:
    for s in range(shards):
        numbers = range(s * PER_SHARD, (s + 1) * PER_SHARD)
        write_tar(
            root / f"parts/data-{s}.tar",
            [(f"{key_of(n)}.txt", f"text {n}".encode()) for n in numbers],
        )
    return root


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / ".nv-meta" / "index.sqlite")


def _schema(root: Path) -> set[tuple]:
    """Every schema entry but where its pages are (which differs with the order of building)."""
    return set(_db(root).execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))


def _record_key_index_builds(monkeypatch) -> list[str]:
    built: list[str] = []
    build = SqliteIndexWriter._build_key_index

    def recording_build(self):
        built.append(self.db_path.name)
        return build(self)

    monkeypatch.setattr(SqliteIndexWriter, "_build_key_index", recording_build)
    return built


@pytest.mark.parametrize("num_workers", [1, 2])
def test_hashed_keys_get_the_reference_schema_and_a_sound_key_index(
    tmp_path, monkeypatch, num_workers
):
    built = _record_key_index_builds(monkeypatch)
    numbered = _write_shards(tmp_path / "numbered", _numbered)
    prepare_dataset(numbered, progress=False, num_workers=num_workers)
    assert built == []  # ascending keys: the index was kept up as rows came in
    hashed = _write_shards(tmp_path / "hashed", _hashed)
    prepare_dataset(hashed, progress=False, num_workers=num_workers)
    assert len(built) == 1  # keys in any other order: built once, at the end

    assert _schema(hashed) == _schema(numbered)
    assert ("index", "sqlite_autoindex_samples_1", "samples", None) in _schema(hashed)
    db = _db(hashed)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = db.execute("SELECT rowid, tar_file_id, sample_key, sample_index FROM samples").fetchall()
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (s, _hashed(s * PER_SHARD + i), i) for s in range(5) for i in range(PER_SHARD)
    ]  # in shard and sample order, whatever the keys
    plan = db.execute(
        "EXPLAIN QUERY PLAN SELECT rowid FROM samples WHERE sample_key = ?", (rows[3][2],)
    ).fetchall()
    assert "sqlite_autoindex_samples_1" in plan[0][-1]
    for rowid, _, key, _ in rows:
        assert db.execute("SELECT rowid FROM samples WHERE sample_key = ?", (key,)).fetchall() == [
            (rowid,)
        ]
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE constraint failed"):
        db.execute("INSERT INTO samples VALUES (0, ?, 99, 0, 0)", (rows[20][2],))


def test_building_the_key_index_at_the_end_writes_what_keeping_it_up_writes(tmp_path, monkeypatch):
    """The same hashed shards, once with the key index kept up (forced) and once built at the
    end: the same rows, rowids and key order, and the same schema."""
    roots = {}
    for at_end in (False, True):
        monkeypatch.setattr(SqliteIndexWriter, "_chunk_keys_ascend", lambda self, e=at_end: not e)
        roots[at_end] = _write_shards(tmp_path / str(at_end), _hashed)
        prepare_dataset(roots[at_end], progress=False, num_workers=2)
    queries = (
        "SELECT rowid, * FROM samples ORDER BY rowid",
        "SELECT rowid, * FROM sample_parts ORDER BY rowid",
        "SELECT sample_key, rowid FROM samples INDEXED BY sqlite_autoindex_samples_1 "
        "WHERE sample_key > ''",
    )
    for query in queries:
        kept, late = (_db(roots[at_end]).execute(query).fetchall() for at_end in (False, True))
        assert kept and kept == late, query
    assert _schema(roots[False]) == _schema(roots[True])


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_duplicate_found_at_the_end_names_the_key_and_both_places(
    tmp_path, monkeypatch, num_workers
):
    built = _record_key_index_builds(monkeypatch)
    write_tar(tmp_path / "a.tar", [(f"{_hashed(n)}.txt", b"a") for n in (5, 1, 9)])
    write_tar(tmp_path / "b.tar", [(f"{_hashed(n)}.txt", b"b") for n in (7, 9, 3)])
    write_tar(tmp_path / "c.tar", [(f"{_hashed(n)}.txt", b"c") for n in (1, 4)])
    with pytest.raises(DuplicateSampleKeyError) as raised:
        prepare_dataset(tmp_path, progress=False, num_workers=num_workers)
    assert len(built) == 1
    e = raised.value
    # the first row whose key came before (b.tar's second sample), and where it came first
    # (a.tar's third: one 512-byte header and one 512-byte block per sample)
    assert (e.key, e.first, e.second) == (
        _hashed(9),
        "shard a.tar at byte offset 2048",
        "shard b.tar at byte offset 1024",
    )
    assert not has_info(tmp_path)
    assert not (tmp_path / ".nv-meta" / "index.sqlite").exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_the_sort_spills_next_to_the_index_and_the_setting_comes_back(tmp_path):
    """sqlite's temporary directory is the process's: set for the sort, then given back."""

    def current() -> list:
        db = sqlite3.connect(":memory:")
        try:
            return db.execute("PRAGMA temp_store_directory").fetchall()
        finally:
            db.close()

    before = current()
    folder = tmp_path / "it's here"  # a quote in the name
    folder.mkdir()
    with sqlite_index._sort_files_in(folder):
        assert current() == [(str(folder),)]
    assert current() == before


def test_the_sort_at_the_end_shows_a_line_with_its_time(tmp_path, capsys, monkeypatch):
    """The shards' bar is full when the sort starts: a line says what runs and for how long
    (sqlite's progress handler refreshes it); keys that ascend have no such step."""
    calls = []
    close = SqliteIndexWriter.close

    def counting_close(self, on_progress=None):
        def counted():
            calls.append(1)
            on_progress()

        return close(self, counted if on_progress is not None else None)

    monkeypatch.setattr(SqliteIndexWriter, "close", counting_close)
    monkeypatch.setattr(sqlite_index, "_PROGRESS_STEPS", 50)
    prepare_dataset(_write_shards(tmp_path / "numbered", _numbered), progress=True, num_workers=1)
    assert "Sorting the keys" not in capsys.readouterr().err
    prepare_dataset(_write_shards(tmp_path / "hashed", _hashed), progress=True, num_workers=1)
    err = capsys.readouterr().err
    assert f"Sorting the keys of {5 * PER_SHARD} samples (they are in no order): 00:0" in err
    assert calls, "the sort reported no progress"
    assert _db(tmp_path / "hashed").execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_an_sqlite_that_refuses_schema_edits_keeps_a_working_unique_index(tmp_path, monkeypatch):
    """Some sqlite builds refuse writes to ``sqlite_master`` (defensive mode). Here an authorizer
    refuses them for real: the key index then keeps its own name, with a warning, and still
    finds every key and refuses duplicates; the schema is left whole."""
    record = SqliteIndexWriter._record_as_the_tables_own

    def refusing(self):
        def authorizer(action, table, *_):
            if action == sqlite3.SQLITE_UPDATE and table == "sqlite_master":
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        self._db.set_authorizer(authorizer)
        try:
            return record(self)
        finally:
            self._db.set_authorizer(None)

    monkeypatch.setattr(SqliteIndexWriter, "_record_as_the_tables_own", refusing)
    root = _write_shards(tmp_path, _hashed)
    with pytest.warns(UserWarning, match="stays the unique index samples_key_built_at_end"):
        prepare_dataset(root, progress=False, num_workers=1)
    db = _db(root)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert ("index", "samples_key_built_at_end", "samples") in {r[:3] for r in _schema(root)}
    key = _hashed(11)
    plan = db.execute("EXPLAIN QUERY PLAN SELECT * FROM samples WHERE sample_key = ?", (key,))
    assert "samples_key_built_at_end" in plan.fetchall()[0][-1]
    assert db.execute(
        "SELECT sample_index FROM samples WHERE sample_key = ?", (key,)
    ).fetchall() == [(11 - PER_SHARD,)]
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE constraint failed"):
        db.execute("INSERT INTO samples VALUES (0, ?, 99, 0, 0)", (key,))


def test_a_duplicate_within_one_chunk_names_both_places(tmp_path, monkeypatch):
    """Two shards per chunk (a 2-chunk plan): the first chunk's keys ascend, so the key index is
    kept up, and the second chunk holds both copies of a key. The failed insert is undone, so
    the explanation finds both copies in the chunk itself."""
    monkeypatch.setattr("energon.prepare.work.MAX_CHUNKS", 2)
    built = _record_key_index_builds(monkeypatch)
    for name, keys in (("a", "k1 k2"), ("b", "k3 k4"), ("c", "k5 k6"), ("d", "k7 k5")):
        write_tar(tmp_path / f"{name}.tar", [(f"{key}.txt", b"x") for key in keys.split()])
    with pytest.raises(DuplicateSampleKeyError) as raised:
        prepare_dataset(tmp_path, progress=False, num_workers=1)
    assert built == []  # found while merging, not at the end
    e = raised.value
    assert (e.key, e.first, e.second) == (
        "k5",
        "shard c.tar at byte offset 0",
        "shard d.tar at byte offset 1024",
    )
    assert not has_info(tmp_path) and not list(tmp_path.rglob("*.sqlite*"))
