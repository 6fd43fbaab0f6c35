"""``.nv-meta/.prepare-work``: the chunks a ``prepare`` has finished, kept until it succeeds.

``prepare`` cuts the shard list into chunks of consecutive shards (the same cut for the same
shard list, whatever the number of workers) and scans them in worker processes
(:mod:`energon.prepare.scan`); each finished chunk is a folder here. A run that was
killed (or failed) leaves its finished chunks behind, and the next ``prepare`` of the same
shards with the same options (``plan.json`` records both; the shards' sizes and modification
times are checked per chunk) scans only the chunks that are missing, then builds the same
files a run from scratch would: chunks are merged in shard order, so the result is
byte-for-byte the same (``index.uuid`` aside, which is new on every run). A ``prepare`` with
other shards or options starts over. The folder is removed when the dataset was published.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from energon.format.layout import atomic_write_text, nv_meta_dir, remove_quietly, temp_name_for
from energon.prepare.scan import CHUNK_FILES, CHUNK_META, ChunkSummary, files_complete, shard_stat

WORK_FOLDER_NAME = ".prepare-work"
PLAN_FILENAME = "plan.json"
MAX_CHUNKS = 1024  # chunks of one prepare at most (resuming redoes at most one chunk per worker)
MAX_CHUNK_SHARDS = 64


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
    """The finished chunks of one plan (a shard list and scan options)."""

    def __init__(self, root: Path, shards: Sequence[str], options: dict) -> None:
        self.path = nv_meta_dir(root) / WORK_FOLDER_NAME
        self.shards = list(shards)
        self.chunk_shards = chunk_shards_for(len(shards))
        self.key = plan_key(shards, {**options, "chunk_shards": self.chunk_shards})
        self.num_chunks = -(-len(shards) // self.chunk_shards)

    def open(self) -> None:
        """Keep the chunks of the same plan (drop unfinished ones), start over otherwise."""
        plan = self.path / PLAN_FILENAME
        try:
            same = json.loads(plan.read_text())["key"] == self.key
        except (OSError, ValueError, KeyError, TypeError):
            same = False
        if not same:
            discard(self.path)
            self.path.mkdir(parents=True)
            atomic_write_text(plan, json.dumps({"key": self.key, "chunks": self.num_chunks}))
            return
        for entry in self.path.iterdir():  # a killed worker's half-written chunk
            if ".tmp" in entry.name:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else remove_quietly(
                    entry
                )

    def chunk_folder(self, chunk: int) -> Path:
        return self.path / f"chunk-{chunk:06d}"

    def chunk_range(self, chunk: int) -> range:
        first = chunk * self.chunk_shards
        return range(first, min(first + self.chunk_shards, len(self.shards)))

    def finished(self, chunk: int, tar_paths: Sequence[str]) -> ChunkSummary | None:
        """The chunk's summary if it is finished (every file it lists is there, complete) and
        its shards did not change since; otherwise its folder, if any, is removed."""
        folder = self.chunk_folder(chunk)
        try:
            with open(folder / CHUNK_META) as f:
                meta = json.load(f)
            summary = ChunkSummary.from_json(meta)
            complete = files_complete(folder, meta[CHUNK_FILES])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            summary, complete = None, False
        if not complete or summary.stats != [shard_stat(p) for p in tar_paths]:
            discard(folder)
            return None
        return summary

    def chunk_files(self, chunk: int, subfolder: str, suffix: str) -> Iterator[tuple[int, Path]]:
        """(global shard number, file) of each shard of the chunk in ``subfolder``."""
        folder = self.chunk_folder(chunk) / subfolder
        for n, shard_id in enumerate(self.chunk_range(chunk)):
            yield shard_id, folder / f"{n}{suffix}"

    def remove(self) -> None:
        discard(self.path)


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
