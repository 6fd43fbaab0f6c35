"""``.nv-meta/.prepare-work``: the chunks a ``prepare`` has finished, kept until it succeeds.

``prepare`` cuts the shard list into chunks of consecutive shards (the same cut for the same
shard list, whatever the number of workers) and scans them in worker processes
(:mod:`energon.prepare.scan`); each finished chunk is a folder here. A run that was
killed (or failed) leaves its finished chunks behind, and the next ``prepare`` of the same
shards with the same options (``plan.json`` records both; the shards' sizes and modification
times are checked per chunk) scans only the chunks that are missing, then builds the same
files a run from scratch would: chunks are merged in shard order, so the result is
byte-for-byte the same (``index.uuid`` aside, which is new on every run). The index being
built lives here too (or in ``--tmp-path``; ``plan.json`` says where), and holds a whole number
of chunks after a kill: chunks it holds need no rows any more (:mod:`energon.prepare.merge`).
A ``prepare`` with other shards or options starts over. The folder is removed when the dataset
was published.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    atomic_write_text,
    nv_meta_dir,
    remove_quietly,
    temp_name_for,
)
from energon.prepare.scan import (
    CHUNK_FILES,
    CHUNK_META,
    CHUNK_ROWS,
    ChunkSummary,
    files_complete,
    shard_stat,
)

WORK_FOLDER_NAME = ".prepare-work"
PLAN_FILENAME = "plan.json"
MAX_CHUNKS = 1024  # chunks of one prepare at most (resuming redoes at most one chunk per worker)
MAX_CHUNK_SHARDS = 64
# the name of an index built in a --tmp-path folder (the work folder's own is INDEX_SQLITE_FILENAME)
_OWN_INDEX_NAME = re.compile(r"^\.energon-index-[0-9a-f]{16}\.sqlite$")


def chunk_shards_for(num_shards: int) -> int:
    """Shards per chunk: about MAX_CHUNKS chunks, at most MAX_CHUNK_SHARDS shards each."""
    return max(1, min(MAX_CHUNK_SHARDS, -(-num_shards // MAX_CHUNKS)))


def plan_key(shards: Sequence[str], options: dict) -> str:
    """What a chunk's content depends on: the shard list and the scan options."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for shard in shards:
        h.update(shard.encode() + b"\n")
    return h.hexdigest()


class WorkFolder:
    """The finished chunks of one plan (a shard list and scan options), and the ``index.sqlite``
    being built from them (:attr:`index_path`: here, or in ``index_folder``, ``--tmp-path``)."""

    def __init__(
        self,
        root: Path,
        shards: Sequence[str],
        options: dict,
        index_folder: Path | None = None,
    ) -> None:
        self.path = nv_meta_dir(root) / WORK_FOLDER_NAME
        self.shards = list(shards)
        self.chunk_shards = chunk_shards_for(len(shards))
        self.key = plan_key(shards, {**options, "chunk_shards": self.chunk_shards})
        self.num_chunks = -(-len(shards) // self.chunk_shards)
        if index_folder is None:
            self.index_path = self.path / INDEX_SQLITE_FILENAME
        else:  # a folder other datasets may share: the name says whose it is
            owner = hashlib.sha256(f"{Path(root).absolute()}\n{self.key}".encode()).hexdigest()
            self.index_path = Path(index_folder) / f".energon-index-{owner[:16]}.sqlite"
        self._chunk_files: dict[int, dict[str, int]] = {}

    def open(self) -> None:
        """Keep the chunks of the same plan (drop unfinished ones), start over otherwise; an
        index built elsewhere by an earlier plan (or with another ``--tmp-path``) goes."""
        plan_path = self.path / PLAN_FILENAME
        try:
            plan = json.loads(plan_path.read_text())
            same = plan["key"] == self.key
            previous_index = plan.get("index")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            same, previous_index = False, None
        if isinstance(previous_index, str) and previous_index != str(self.index_path):
            previous = Path(previous_index)
            if previous == self.path / INDEX_SQLITE_FILENAME or _OWN_INDEX_NAME.match(
                previous.name
            ):
                remove_database(previous)  # (never any other file a damaged plan might name)
        if same:
            for entry in self.path.iterdir():  # a killed worker's half-written chunk
                if ".tmp" in entry.name:
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else (
                        remove_quietly(entry)
                    )
        else:
            discard(self.path)
            self.path.mkdir(parents=True)
        if not same or previous_index != str(self.index_path):
            plan = {"key": self.key, "chunks": self.num_chunks, "index": str(self.index_path)}
            atomic_write_text(plan_path, json.dumps(plan))

    def chunk_folder(self, chunk: int) -> Path:
        return self.path / f"chunk-{chunk:06d}"

    def chunk_range(self, chunk: int) -> range:
        first = chunk * self.chunk_shards
        return range(first, min(first + self.chunk_shards, len(self.shards)))

    def summary(self, chunk: int, tar_paths: Sequence[str]) -> ChunkSummary | None:
        """The chunk's summary if an earlier run finished it and its shards did not change
        since (whether its files are all there is :meth:`complete`'s question)."""
        folder = self.chunk_folder(chunk)
        try:
            with open(folder / CHUNK_META) as f:
                meta = json.load(f)
            summary = ChunkSummary.from_json(meta)
            self._chunk_files[chunk] = {str(k): int(v) for k, v in meta[CHUNK_FILES].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if summary.stats != [shard_stat(p) for p in tar_paths]:
            return None
        return summary

    def complete(self, chunk: int, rows: bool) -> bool:
        """Whether every file of the chunk (after :meth:`summary`) is there with its size: its
        rows only when ``rows`` (a chunk the index holds has none any more)."""
        files = self._chunk_files.get(chunk, {})
        if not rows:
            files = {rel: size for rel, size in files.items() if rel != CHUNK_ROWS}
        return bool(files) and files_complete(self.chunk_folder(chunk), files)

    def drop_chunk(self, chunk: int) -> None:
        """Remove a chunk's folder (to scan it again)."""
        discard(self.chunk_folder(chunk))

    def drop_rows(self, chunk: int) -> None:
        """The chunk's rows, once the index holds them: the work folder would otherwise keep a
        second copy of every row until the end (0.4x the index's size)."""
        remove_quietly(self.chunk_folder(chunk) / CHUNK_ROWS)

    def chunk_files(self, chunk: int, subfolder: str, suffix: str) -> Iterator[tuple[int, Path]]:
        """(global shard number, file) of each shard of the chunk in ``subfolder``."""
        folder = self.chunk_folder(chunk) / subfolder
        for n, shard_id in enumerate(self.chunk_range(chunk)):
            yield shard_id, folder / f"{n}{suffix}"

    def remove(self) -> None:
        remove_database(self.index_path)
        discard(self.path)


def remove_database(path: Path) -> None:
    """An sqlite file and its rollback journal."""
    remove_quietly(path)
    remove_quietly(path.with_name(path.name + "-journal"))


def discard(folder: Path) -> None:
    """Remove a folder so that a kill at any moment leaves it whole or gone from its name: it is
    renamed to a temporary name first (which the next run removes, if this one cannot)."""
    doomed = temp_name_for(folder)
    try:
        os.rename(folder, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def publish_file(source: Path, target: Path) -> None:
    """Put a copy of ``source`` at ``target`` atomically: a hard link (or, across file systems, a
    copy) under a temporary name, renamed. The chunk keeps its file, so a run killed while it
    publishes is continued, not started over."""
    tmp = temp_name_for(target)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        # rename() of two links to one file (an earlier, killed run published this very file)
        # does nothing and leaves the temporary name behind
        remove_quietly(tmp)
