"""One chunk of a ``prepare``: scan a run of consecutive shards in a worker process and leave
everything they contribute in the chunk's folder.

A chunk's folder (``.nv-meta/.prepare-work/chunk-NNNNNN``) holds, for its shards in order,
``idx/<n>.idx`` (the ``.tar.idx`` bytes), ``crc/<n>.crc32`` (with ``--checksums``),
``rows.sqlite`` (the chunk's rows of ``index.sqlite``, media metadata included; not with
``--no-sample-tables``) and ``meta.json`` (sample counts, part names, the first samples, the
size and modification time of each shard it was made from, and the size of each of the chunk's
other files, checked before a later run uses them). It is written under a temporary
name and renamed when complete: a folder with the final name is a finished chunk, which a
``prepare`` killed later does not have to scan again (:mod:`energon.prepare.work`).
Nothing is held in memory beyond one shard's scan, so a worker's memory does not depend on the
size of the dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from energon import epath
from energon.errors import EmptyShardError, ShardReadError
from energon.format.checksums import encode_checksums, sample_checksums
from energon.format.layout import remove_quietly
from energon.format.sqlite_index import SqliteIndexWriter
from energon.format.tar import TarScan, scan_tar
from energon.format.tar_index import encode_offsets
from energon.media.extract import MediaFilterConfig
from energon.prepare.media import media_rows_for_samples

MAX_PART_NAMES = 50
CHUNK_META = "meta.json"
CHUNK_ROWS = "rows.sqlite"
CHUNK_FILES = "files"  # in meta.json: the size of every other file of the chunk


@dataclass(frozen=True)
class ChunkTask:
    """Shards ``first_id ...`` (their numbers in ``.info.json``: ``tar_file_id``) of one chunk."""

    chunk: int
    first_id: int
    shards: tuple[str, ...]  # relative names
    tar_paths: tuple[str, ...]  # local paths or URLs
    folder: str  # the chunk's folder, once finished
    sample_tables: bool = True
    checksums: bool = False
    media_filter: MediaFilterConfig | None = None
    download_dir: str | None = None  # remote shards are streamed into a temporary file here


@dataclass
class ChunkSummary:
    """What the parent keeps of a chunk (small: a few numbers per shard)."""

    chunk: int
    counts: list[int]
    part_names: list[str]  # distinct, first-seen order, at most MAX_PART_NAMES
    first_samples: list[tuple[str, list[str]]] = field(default_factory=list)
    stats: list[list[int]] = field(default_factory=list)  # [size, mtime_ns] of each shard

    def to_json(self) -> dict:
        return {
            "chunk": self.chunk,
            "counts": self.counts,
            "part_names": self.part_names,
            "first_samples": self.first_samples,
            "stats": self.stats,
        }

    @classmethod
    def from_json(cls, data: dict) -> ChunkSummary:
        return cls(
            int(data["chunk"]),
            [int(c) for c in data["counts"]],
            [str(p) for p in data["part_names"]],
            [(str(k), [str(p) for p in parts]) for k, parts in data["first_samples"]],
            [[int(a), int(b)] for a, b in data["stats"]],
        )


def shard_stat(path: str) -> list[int]:
    """[size, mtime_ns] of a shard (remote: size and 0; an ETag would need a request each)."""
    if epath.is_remote(path):
        return [0, 0]
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def run_chunk(task: ChunkTask) -> ChunkSummary:
    """Scan the chunk's shards and publish its folder (runs in a worker process)."""
    final = Path(task.folder)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "idx").mkdir(parents=True)
    if task.checksums:
        (tmp / "crc").mkdir()
    try:
        summary = _scan_into(task, tmp)
        meta = {**summary.to_json(), CHUNK_FILES: file_sizes(tmp)}  # before meta.json exists
        with open(tmp / CHUNK_META, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, final)  # the chunk is finished from here on
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def file_sizes(folder: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file below ``folder`` (what a finished chunk holds)."""
    sizes = {}
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            path = os.path.join(dirpath, name)
            sizes[os.path.relpath(path, folder)] = os.stat(path).st_size
    return sizes


def files_complete(folder: Path, sizes: dict[str, int]) -> bool:
    """Whether every file listed in a chunk's ``meta.json`` is there with its size."""
    try:
        return all(os.stat(folder / rel).st_size == size for rel, size in sizes.items())
    except OSError:
        return False


def _scan_into(task: ChunkTask, folder: Path) -> ChunkSummary:
    summary = ChunkSummary(task.chunk, [], [])
    names = {task.first_id + n: shard for n, shard in enumerate(task.shards)}
    writer = (
        SqliteIndexWriter(folder / CHUNK_ROWS, names, chunk=True) if task.sample_tables else None
    )
    try:
        for n, tar_path in enumerate(task.tar_paths):
            scan = _scan_shard(tar_path, task, folder, n, writer)
            summary.counts.append(len(scan.keys))
            summary.stats.append(shard_stat(tar_path))
            _collect_parts(summary.part_names, scan)
            if task.first_id == 0 and n == 0:
                summary.first_samples = _first_samples(scan, 2)
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return summary


def _scan_shard(
    tar_path: str, task: ChunkTask, folder: Path, n: int, writer: SqliteIndexWriter | None
) -> TarScan:
    """One shard: its index (and checksums) into the folder, its rows into ``writer``."""
    local = tar_path
    if epath.is_remote(tar_path):
        fd, local = tempfile.mkstemp(dir=task.download_dir, prefix=".shard-", suffix=".tar")
        os.close(fd)
        try:
            epath.download(tar_path, local)
        except OSError as e:
            remove_quietly(local)
            raise ShardReadError(f"{tar_path}: cannot read shard: {e}") from None
    try:
        scan = _scan_local(local, tar_path)
        offsets = array("Q", scan.sample_offsets())
        index_bytes = encode_offsets(offsets)
        (folder / "idx" / f"{n}.idx").write_bytes(index_bytes)
        if task.checksums:
            sums = sample_checksums(local, offsets)
            (folder / "crc" / f"{n}.crc32").write_bytes(encode_checksums(index_bytes, sums))
        if writer is not None:
            _write_rows(writer, task.first_id + n, scan, offsets, local, task.media_filter)
    finally:
        if local != tar_path:
            remove_quietly(local)
    return scan


def _scan_local(local: str, shown: str) -> TarScan:
    try:
        scan = scan_tar(local, display_path=shown)
    except OSError as e:
        raise ShardReadError(f"{shown}: cannot read shard: {e.strerror or e}") from None
    if not scan.keys:
        raise EmptyShardError(
            f"{shown}: shard contains no samples (no members named '<key>.<part>'); "
            "remove it or exclude it with --exclude"
        )
    return scan


def _write_rows(
    writer: SqliteIndexWriter,
    tar_file_id: int,
    scan: TarScan,
    offsets: array,
    local: str,
    media_filter: MediaFilterConfig | None,
) -> None:
    writer.add_shard(
        tar_file_id,
        scan.keys,
        offsets,
        scan.part_sample,
        scan.part_names,
        scan.part_offsets,
        scan.part_sizes,
    )
    if media_filter is not None:  # same pass over the shard: its payloads are read while hot
        with open(local, "rb") as f:
            rows = media_rows_for_samples(f, scan.samples, media_filter)
        if rows:
            writer.add_media_rows(rows)


def _first_samples(scan: TarScan, count: int) -> list[tuple[str, list[str]]]:
    """The first ``count`` samples' keys and part names (what the CLI wizard shows)."""
    first: list[tuple[str, list[str]]] = [(key, []) for key in scan.keys[:count]]
    for sample, part in zip(scan.part_sample, scan.part_names):
        if sample >= count:
            break
        first[sample][1].append(part)
    return first


def _collect_parts(seen: list[str], scan: TarScan) -> None:
    """Add the shard's part names not seen yet (first-seen order, at most MAX_PART_NAMES)."""
    if len(seen) >= MAX_PART_NAMES:
        return
    found = dict.fromkeys(scan.part_names)
    seen += [part for part in found if part not in seen][: MAX_PART_NAMES - len(seen)]
