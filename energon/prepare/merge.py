"""The new ``index.sqlite`` of a ``prepare``, filled from the chunks while later ones are scanned.

One process writes the index (sqlite has one writer), so its work is what is left when many
workers scan the shards. It is done while they scan: each chunk's rows are appended as soon as
it and every chunk before it are finished, in chunk order, so the rows (and their ``rowid``)
are the same whichever worker finished first, and the same as a run that was killed and
continued. The lookup indexes exist from the start: rows arrive sorted by
``(tar_file_id, sample_index)``, so keeping them up costs less than sorting every row at the end
(the key index too, when the keys grow in that order; see ``SqliteIndexWriter``).
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from energon.format.layout import INDEX_SQLITE_FILENAME, nv_meta_dir, temp_name_for
from energon.format.sqlite_index import SqliteIndexWriter
from energon.media.extract import MediaFilterConfig
from energon.prepare.scan import CHUNK_ROWS
from energon.prepare.work import WorkFolder


class IndexMerge:
    """Appends the rows of finished chunks to a new ``index.sqlite`` (under a temporary name,
    :attr:`path`), in chunk order."""

    def __init__(self, root: Path, work: WorkFolder, shards: list[str], folder: Path) -> None:
        """``folder``: where the index is built (``prepare --tmp-path``, or ``.nv-meta``)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.work = work
        self.path = temp_name_for(folder / INDEX_SQLITE_FILENAME)
        self._writer = SqliteIndexWriter(self.path, shards)
        self._finished: set[int] = set()
        self._next = 0  # the first chunk not merged yet

    def chunk_finished(self, chunk: int) -> None:
        """Merge ``chunk`` and those after it that were waiting for it."""
        self._finished.add(chunk)
        while self._next in self._finished:
            self._finished.discard(self._next)
            self._writer.add_chunk(self.work.chunk_folder(self._next) / CHUNK_ROWS)
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
