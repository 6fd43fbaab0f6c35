"""The new ``index.sqlite`` of a ``prepare``, filled from the chunks while later ones are scanned.

One process writes the index (sqlite has one writer), so its work is what is left when many
workers scan the shards. It is done while they scan: each chunk's rows are appended as soon as
it and every chunk before it are finished, in chunk order, so the rows (and their ``rowid``)
are the same whichever worker finished first, and the same as a run that was killed and
continued. The lookup indexes exist from the start: rows arrive sorted by
``(tar_file_id, sample_index)``, so keeping them up costs less than sorting every row at the end
(the key index too, when the keys grow in that order; see ``SqliteIndexWriter``).

The index is built at a fixed place (``WorkFolder.index_path``) and each chunk is added in one
transaction, so a killed run leaves an index that holds a whole number of chunks: the next run
continues it, and a chunk's own rows are deleted as soon as the index holds them (the work
folder would otherwise keep a second copy of every row until the end).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tqdm import tqdm

from energon.format.layout import INDEX_SQLITE_FILENAME, nv_meta_dir
from energon.format.sqlite_index import SqliteIndexWriter
from energon.media.extract import MediaFilterConfig
from energon.prepare.scan import CHUNK_ROWS
from energon.prepare.work import WorkFolder, remove_database


class IndexMerge:
    """Appends the rows of finished chunks to the ``index.sqlite`` being built (at
    :attr:`path`), in chunk order, continuing what a killed run built."""

    def __init__(self, root: Path, work: WorkFolder, shards: list[str]) -> None:
        self.root = root
        self.work = work
        self.shards = shards
        self.path = work.index_path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = self._open()
        self._finished: set[int] = set()
        self._next = 0  # the first chunk not merged yet
        self._held_samples = 0  # the samples of chunks 0 .. _next - 1

    def holds(self, chunk: int, samples: int) -> bool:
        """Whether the index already holds ``chunk`` (of ``samples`` samples): asked of the
        chunks an earlier run finished, in chunk order, before anything is merged."""
        if chunk != self._next or self._held_samples + samples > self._writer.rows_written:
            return False
        self._next += 1
        self._held_samples += samples
        return True

    def holds_what_it_should(self) -> bool:
        """Whether the chunks :meth:`holds` took are exactly the index's rows (if not, a chunk
        it holds changed or went: :meth:`start_over`)."""
        return self._held_samples == self._writer.rows_written

    def _open(self) -> SqliteIndexWriter:
        """The index a killed run left (or a new one)."""
        try:
            return SqliteIndexWriter(self.path, self.shards)
        except sqlite3.DatabaseError:  # damaged (the disk, or a hand): build it again
            remove_database(self.path)
            return SqliteIndexWriter(self.path, self.shards)

    def start_over(self) -> None:
        """An empty index (the chunks must then all have their rows)."""
        self._writer.abort()
        remove_database(self.path)
        self._writer = SqliteIndexWriter(self.path, self.shards)
        self._next = self._held_samples = 0

    def chunk_finished(self, chunk: int) -> None:
        """Merge ``chunk`` and those after it that were waiting for it; a chunk the index
        already holds (scanned again for its other files) only gives up its rows."""
        if chunk < self._next:
            self.work.drop_rows(chunk)
            return
        self._finished.add(chunk)
        while self._next in self._finished:
            self._finished.discard(self._next)
            self._writer.add_chunk(self.work.chunk_folder(self._next) / CHUNK_ROWS)
            self.work.drop_rows(self._next)
            self._next += 1

    def close(self, media_filter: MediaFilterConfig | None, progress: bool = False) -> None:
        """After the last chunk: the media metadata (new, or carried over from the old index),
        and the key index where it is built at the end (with ``progress``, a line that shows
        the time it takes: the shards' bar is full by then)."""
        if self._next != self.work.num_chunks:
            raise RuntimeError(f"merged {self._next} of {self.work.num_chunks} chunks")
        if media_filter is None:
            self._writer.copy_media_tables_from(nv_meta_dir(self.root) / INDEX_SQLITE_FILENAME)
        else:
            self._writer.add_media_filter(media_filter.strategy.value, media_filter.patterns_column)
        if not (progress and self._writer.key_index_at_end):
            self._writer.close()
            return
        rows = self._writer.rows_written
        desc = f"Sorting the keys of {rows:,} samples (they are in no order)"
        with tqdm(desc=desc, bar_format="{desc}: {elapsed}") as bar:
            self._writer.close(on_progress=bar.update)

    def abort(self) -> None:
        self._writer.abort()
