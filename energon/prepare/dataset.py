"""``prepare``: scan a WebDataset's shards once and write its ``.nv-meta`` metadata.

Shards are scanned in chunks of consecutive shards by parallel worker processes, each reading
only tar headers (:mod:`energon.prepare.scan`); finished chunks wait in
``.nv-meta/.prepare-work`` (:mod:`energon.prepare.work`), so a killed run is continued by
the next. Results are merged in the order of the shard list (which defines ``tar_file_id``), so
the output does not depend on which worker finished first, nor on where a run was killed.

Nothing is published until every shard was scanned: tar indices, checksums and ``index.sqlite``
are built under temporary names (or in the work folder), then renamed into place; ``dataset.yaml`` (the caller's
``before_info`` step) comes next and ``.info.json`` (the "this dataset is prepared" marker) is
written last, so a killed run never leaves a dataset that looks prepared without the rest. A
failed run leaves the previous metadata as it was.

One prepare at a time per dataset folder: a run holds an exclusive lock
(``.nv-meta/.prepare.lock``, ``flock``; released by the kernel even on ``kill -9``) and, holding it,
first removes the temporary files that killed runs left behind.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from energon import epath
from energon.errors import EmptyShardError as EmptyShardError  # raised while scanning
from energon.errors import PrepareError
from energon.errors import ShardReadError as ShardReadError
from energon.format.checksums import checksum_rel_path
from energon.format.info import (
    DatasetInfoError,
    current_energon_version,
    has_info,
    info_json_text,
    read_dataset_info,
    read_info,
    write_info,
)
from energon.format.layout import (
    CHECKSUMS_FOLDER_NAME,
    CHECKSUMS_SUFFIX,
    INDEX_SQLITE_FILENAME,
    INDEX_UUID_FILENAME,
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SHARD_TABLE_FILENAME,
    SPLIT_YAML_FILENAME,
    PathLike,
    copy_permissions,
    nv_meta_dir,
    prepare_lock,
    remove_quietly,
    temp_name_for,
)
from energon.format.processes import process_context
from energon.format.split import (  # split_by_*: also importable from here, as before
    expand_all,
    split_by_patterns,
    split_by_ratio,
    write_split,
)
from energon.format.split_shards import write_shard_table
from energon.format.sqlite_index import write_index_uuid
from energon.format.tar_index import tar_index_path
from energon.media.extract import MediaFilterConfig
from energon.prepare.cluster import run_chunks_on_cluster
from energon.prepare.merge import IndexMerge
from energon.prepare.scan import (
    MAX_PART_NAMES,
    ChunkSummary,
    ChunkTask,
    run_chunk,
)
from energon.prepare.work import WorkFolder, publish_file, remove_database

SHARD_SUFFIXES = (".tar", ".tgz")
DEFAULT_SPLIT_NAMES = ("train", "val", "test")


@dataclass
class PrepareResult:
    """What ``prepare`` found (used by the CLI wizard to propose a ``dataset.yaml``)."""

    shard_counts: dict[str, int]
    part_names: list[str]  # first-seen order, at most MAX_PART_NAMES
    first_samples: list[tuple[str, list[str]]]  # first two samples of the first shard: key, parts
    split_parts: dict[str, list[str]] | None = None  # None with tar_index_only

    @property
    def total_samples(self) -> int:
        return sum(self.shard_counts.values())


# Called with the result and the folder that holds the new metadata, before .info.json is written.
BeforeInfo = Callable[[PrepareResult, Path], None]


# ---------------------------------------------------------------------------------------------
# Shard discovery and split assignment


def discover_shards(root: PathLike, exclude: str | None = None) -> list[str]:
    """All ``*.tar`` / ``*.tgz`` below ``root`` as sorted POSIX paths relative to ``root``.

    ``exclude`` is a regular expression; paths where it matches anywhere (``re.search``) are dropped.
    Symlinked folders are followed (datasets are often assembled from links), each real folder once.
    For an ``s3://`` root, the objects under ``root/`` are listed (``.nv-meta/`` is skipped).
    """
    exclude_re = re.compile(exclude) if exclude else None
    if epath.is_remote(root):
        return _discover_remote_shards(epath.normalize(root), exclude_re)
    root = Path(root)
    found: list[str] = []
    seen_dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:
            dirnames.clear()
            continue
        seen_dirs.add(real)
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            if name.endswith(SHARD_SUFFIXES):
                rel = (rel_dir / name).as_posix()
                if exclude_re is None or not exclude_re.search(rel):
                    found.append(rel)
    return sorted(found)


def _discover_remote_shards(root: str, exclude_re: re.Pattern | None) -> list[str]:
    prefix = root.rstrip("/") + "/"
    found = []
    for url in epath.walk(root):
        rel = url[len(prefix) :]
        if rel.startswith(f"{MAIN_FOLDER_NAME}/") or not rel.endswith(SHARD_SUFFIXES):
            continue
        if exclude_re is None or not exclude_re.search(rel):
            found.append(rel)
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# The whole preparation


@dataclass
class ScanOptions:
    """How shards are scanned (see :func:`prepare_dataset`)."""

    num_workers: int | None = None
    progress: bool = True
    tmp_path: PathLike | None = None
    media_filter: MediaFilterConfig | None = None
    checksums: bool = False
    sample_tables: bool = True
    ray_address: str | None = None  # prepare --ray: the chunks run on this Ray cluster

    def plan(self, remote: bool) -> dict:
        """What the chunks' content depends on (the key of the work folder's plan)."""
        media = self.media_filter
        return {
            "chunk_format": 2,  # 2: meta.json lists the chunk's files
            "remote": remote,
            "checksums": self.checksums,
            "sample_tables": self.sample_tables,
            "media": None if media is None else [media.strategy.value, list(media.patterns)],
        }


@dataclass
class _Staging:
    """Files of one run published together on success. On failure the temporary ones go; the
    finished chunks stay only when the run was interrupted (Ctrl-C; a ``kill -9`` removes
    nothing anyway), for the next run to continue from."""

    run_id: str
    work: WorkFolder | None = None
    sqlite_tmp: Path | None = None
    checksum_dir: Path | None = None  # prepare --checksums: the new checksums folder, filled

    def cleanup(self, interrupted: bool) -> None:
        if self.sqlite_tmp is not None and not interrupted:
            remove_database(self.sqlite_tmp)  # (interrupted: the next run continues it)
        if self.checksum_dir is not None:
            shutil.rmtree(self.checksum_dir, ignore_errors=True)
        if self.work is not None and not interrupted:
            self.work.remove()


@dataclass(frozen=True)
class _PrepareJob:
    """What one ``prepare_dataset`` run does, whether its root is local or remote."""

    shards: Sequence[str] | None
    exclude: str | None
    tar_index_only: bool
    scan: ScanOptions
    splits: SplitOptions
    before_info: BeforeInfo | None

    def resolve_shards(self, root: PathLike) -> list[str]:
        """The shards this run indexes, checked to have distinct index names."""
        shard_list = _resolve_shards(root, self.shards, self.exclude, self.tar_index_only)
        _check_index_names_unique(shard_list)
        return shard_list

    def run_before_info(self, result: PrepareResult, staged_root: Path) -> None:
        if self.before_info is not None:
            self.before_info(result, staged_root)


def _default_num_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def prepare_dataset(
    root: PathLike,
    shards: Sequence[str] | None = None,
    *,
    split_parts_ratio: Sequence[tuple[str, float]] | None = None,
    split_parts_patterns: Sequence[tuple[str, str]] | None = None,
    split_config: str = SPLIT_YAML_FILENAME,
    shuffle_seed: int | None = None,
    exclude: str | None = None,
    num_workers: int | None = None,
    tar_index_only: bool = False,
    progress: bool = True,
    tmp_path: PathLike | None = None,
    media_filter: MediaFilterConfig | None = None,
    checksums: bool = False,
    sample_tables: bool = True,
    before_info: BeforeInfo | None = None,
    ray_address: str | None = None,
) -> PrepareResult:
    """Index every shard of the WebDataset at ``root`` and write ``.nv-meta``.

    ``shards``: relative shard paths (brace patterns allowed); default: all ``*.tar``/``*.tgz``
    found below ``root`` (or, with ``tar_index_only``, the shards of the existing ``.info.json``).
    Splits come from ``split_parts_patterns`` if given, else ``split_parts_ratio`` (default: all
    shards in ``train``). ``tmp_path`` is a folder to build ``index.sqlite`` in (e.g. local disk
    when the dataset lives on a slow network file system). ``media_filter``: also compute media
    metadata (image sizes, audio/video durations, ...) for the parts it selects, replacing any
    media metadata of a previous preparation; without it, existing media metadata is kept.
    ``checksums``: also store a CRC-32 of every sample (reads all shard bytes, not only headers);
    without it, checksums of an earlier preparation are removed (they would be stale).
    ``sample_tables=False`` (``--no-sample-tables``): write only what training reads (no
    ``index.sqlite``; an old one is removed); tools that look samples up by key say so.
    A run that was killed or interrupted is continued by the next one with the same shards and
    options (:mod:`energon.prepare.work`).
    ``before_info(result, staged_root)`` runs after everything else was written and before
    ``.info.json``: the CLI writes ``dataset.yaml`` there, so a killed run never leaves a dataset
    that looks prepared but lacks it (``staged_root`` holds the new metadata: ``root``, or the
    local staging folder of a remote prepare).

    ``ray_address`` (``prepare --ray``): the chunks are scanned in Ray tasks over the nodes of
    that cluster instead of local processes (:mod:`energon.prepare.cluster`; the output is
    byte for byte the same).

    An ``s3://`` root is prepared remotely: see :func:`_prepare_remote`.

    Raises :class:`PrepareError` (empty or unreadable shard), :class:`TarFormatError` (corrupt or
    truncated tar, with file and byte offset) or ``DuplicateSampleKeyError`` (both locations).
    """
    if media_filter is not None and not sample_tables:
        raise PrepareError("media metadata lives in index.sqlite: it needs the sample tables")
    scan = ScanOptions(
        num_workers, progress, tmp_path, media_filter, checksums, sample_tables, ray_address
    )
    splits = SplitOptions(split_parts_ratio, split_parts_patterns, split_config, shuffle_seed)
    job = _PrepareJob(shards, exclude, tar_index_only, scan, splits, before_info)
    if epath.is_remote(root):
        return _prepare_remote(epath.normalize(root), job)
    return _prepare_local(Path(root), job)


def _prepare_local(root: Path, job: _PrepareJob) -> PrepareResult:
    """Prepare the dataset in the local folder ``root`` (see :func:`prepare_dataset`).

    Runs under the dataset's prepare lock; on any failure the run's staged files are removed
    (an interrupt keeps the work folder so the next run continues it) and a ``.nv-meta`` folder
    this run created is removed again if it is still empty.
    """
    if not root.is_dir():
        raise PrepareError(f"{root}: not a directory")
    meta = nv_meta_dir(root)
    created_meta = not meta.exists()
    meta.mkdir(exist_ok=True)
    _copy_dir_mode(root, meta)
    staging = _Staging(run_id=uuid.uuid4().hex[:12])
    try:
        with prepare_lock(root):
            shard_list = job.resolve_shards(root)
            remove_stale_temp_files(root, shard_list)
            result = _index_shards(root, shard_list, staging, job.scan)
            if not job.tar_index_only:
                result.split_parts = _assign_splits(shard_list, job.splits)
            _publish(
                root,
                shard_list,
                staging,
                result,
                job.splits.split_config,
                job.tar_index_only,
                lambda: job.run_before_info(result, root),
            )
            staging.work.remove()  # type: ignore[union-attr]
    except BaseException as e:
        staging.cleanup(interrupted=not isinstance(e, Exception))
        if created_meta and not any(meta.iterdir()):
            meta.rmdir()
        raise
    return result


@dataclass(frozen=True)
class SplitOptions:
    """How shards are assigned to splits (see :func:`prepare_dataset`)."""

    ratio: Sequence[tuple[str, float]] | None = None
    patterns: Sequence[tuple[str, str]] | None = None
    split_config: str = SPLIT_YAML_FILENAME
    shuffle_seed: int | None = None


_INDEX_TEMP_RE = re.compile(r"^\.?.+\.tar\.idx\.[0-9a-f]{12}\.tmp$")
_META_TEMP_RE = re.compile(r"^\..+\.[0-9a-f]{12}\.(?:tmp|old)$")


def remove_stale_temp_files(root: PathLike, shards: Sequence[str]) -> list[str]:
    """Remove the temporary files that killed runs left in ``.nv-meta`` and next to the shards
    (call holding the prepare lock: no other run can own them). Returns what was removed."""
    removed = []
    meta = nv_meta_dir(root)
    folders = {meta: _META_TEMP_RE}
    for shard in shards:
        folders.setdefault(Path(root) / os.path.dirname(shard), _INDEX_TEMP_RE)
    for folder, pattern in folders.items():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if pattern.match(name):
                path = folder / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    remove_quietly(path)
                removed.append(str(path))
    return removed


def _resolve_shards(
    root: Path | str, shards: Sequence[str] | None, exclude: str | None, tar_index_only: bool
) -> list[str]:
    """The shard list to index: given, from the existing .info.json, or discovered (local or URL)."""
    if shards is not None:
        shard_list = expand_all(shards)
        if exclude:
            exclude_re = re.compile(exclude)
            shard_list = [s for s in shard_list if not exclude_re.search(s)]
    elif tar_index_only and has_info(root):
        shard_list = list(read_info(root))
    else:
        shard_list = discover_shards(root, exclude)
    if not shard_list:
        raise PrepareError(f"{root}: did not find any tar files (*.tar, *.tgz)")
    return shard_list


def _check_index_names_unique(shards: Sequence[str]) -> None:
    """``x.tar`` and ``x.tgz`` in one folder would overwrite each other's ``x.tar.idx``."""
    seen: dict[str, str] = {}
    for shard in shards:
        index_name = tar_index_path(shard)
        if index_name in seen:
            raise PrepareError(
                f"shards {seen[index_name]!r} and {shard!r} would share the index file "
                f"{index_name!r}; rename or exclude one of them"
            )
        seen[index_name] = shard


def _copy_dir_mode(root: Path, meta: Path) -> None:
    try:
        os.chmod(meta, (os.stat(root).st_mode & 0o777) | 0o700)
    except OSError:
        pass


def _index_shards(
    root: Path,
    shards: list[str],
    staging: _Staging,
    scan: ScanOptions,
    source_root: str | None = None,
) -> PrepareResult:
    """Scan every shard not scanned yet by an earlier, killed run (in chunks, in parallel worker
    processes) and build a temporary ``index.sqlite`` from the chunks; nothing is published yet.

    ``source_root``: where the shards are read from when that is not ``root`` (remote prepare:
    ``root`` is then the local staging folder and the shards are ``source_root/<shard>`` URLs).
    """
    index_folder = Path(scan.tmp_path) if scan.tmp_path is not None else None
    plan = scan.plan(source_root is not None)
    work = staging.work = WorkFolder(root, shards, plan, index_folder)
    work.open()
    tar_paths = [
        epath.join(source_root, shard) if source_root is not None else str(root / shard)
        for shard in shards
    ]
    merge = None
    if scan.sample_tables:
        merge = IndexMerge(root, work, shards)
        staging.sqlite_tmp = merge.path
    try:
        summaries = _finished_chunks(work, tar_paths, merge)
        if merge is not None and not merge.holds_what_it_should():
            merge.start_over()  # a chunk it held changed: every chunk needs its rows again
            summaries = _finished_chunks(work, tar_paths, merge)
        pending = []
        for chunk in range(work.num_chunks):
            if chunk not in summaries:
                paths = [tar_paths[i] for i in work.chunk_range(chunk)]
                pending.append(_chunk_task(work, chunk, shards, paths, scan, source_root, root))
        if merge is not None:
            for chunk in sorted(summaries):  # finished by an earlier run
                merge.chunk_finished(chunk)
        done = len(shards) - sum(len(t.shards) for t in pending)
        for summary in _run_chunks(pending, scan, len(shards), done):
            summaries[summary.chunk] = summary
            if merge is not None:  # while the workers scan the next chunks
                merge.chunk_finished(summary.chunk)
        if merge is not None:
            merge.close(scan.media_filter, scan.progress)
    except BaseException:
        if merge is not None:
            merge.abort()
        raise
    return _result_of(work, shards, summaries)


def _finished_chunks(
    work: WorkFolder, tar_paths: list[str], merge: IndexMerge | None
) -> dict[int, ChunkSummary]:
    """The chunks an earlier run finished whose files are all there: their rows only where the
    index does not hold them yet. The others are removed, to be scanned again."""
    summaries = {}
    for chunk in range(work.num_chunks):
        summary = work.summary(chunk, [tar_paths[i] for i in work.chunk_range(chunk)])
        if summary is not None:
            held = merge is not None and merge.holds(chunk, sum(summary.counts))
            if work.complete(chunk, rows=merge is not None and not held):
                summaries[chunk] = summary
                continue
        work.drop_chunk(chunk)
    return summaries


def _chunk_task(
    work: WorkFolder,
    chunk: int,
    shards: list[str],
    paths: list[str],
    scan: ScanOptions,
    source_root: str | None,
    root: Path,
) -> ChunkTask:
    ids = work.chunk_range(chunk)
    return ChunkTask(
        chunk,
        ids.start,
        tuple(shards[i] for i in ids),
        tuple(paths),
        str(work.chunk_folder(chunk)),
        scan.sample_tables,
        scan.checksums,
        scan.media_filter,
        str(root) if source_root is not None else None,
    )


def _run_chunks(
    tasks: list[ChunkTask], scan: ScanOptions, total: int, done: int
) -> Iterator[ChunkSummary]:
    """Run the chunks, with a progress bar over the shards."""
    bar = tqdm(total=total, initial=done, desc="Indexing shards", unit="shard")
    bar.disable = not scan.progress
    try:
        for summary in _chunk_summaries(tasks, scan):
            bar.update(len(summary.counts))
            yield summary
    finally:
        bar.close()


def _chunk_summaries(tasks: list[ChunkTask], scan: ScanOptions) -> Iterator[ChunkSummary]:
    """The chunks run on a Ray cluster (``prepare --ray``), in worker processes, or in this one
    (with one worker or one chunk)."""
    if scan.ray_address is not None:
        yield from run_chunks_on_cluster(tasks, scan.ray_address)
        return
    workers = scan.num_workers if scan.num_workers is not None else _default_num_workers()
    if workers <= 1 or len(tasks) <= 1:
        yield from map(run_chunk, tasks)
        return
    remote = any(epath.is_remote(p) for t in tasks for p in t.tar_paths)
    context = process_context(remote)
    # a fork server's children are not ours: only direct children can watch this process
    parent = None if context.get_start_method() == "forkserver" else os.getpid()
    with context.Pool(min(workers, len(tasks)), _die_with_parent, (parent,)) as pool:
        yield from pool.imap_unordered(run_chunk, tasks, chunksize=1)


def _die_with_parent(parent: int | None) -> None:
    """A prepare killed with ``kill -9`` takes its workers with it: otherwise they go on taking
    queued chunks and write into the work folder that the next ``prepare`` continues from."""
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _result_of(
    work: WorkFolder, shards: list[str], summaries: dict[int, ChunkSummary]
) -> PrepareResult:
    counts: dict[str, int] = {}
    part_names: dict[str, None] = {}
    for chunk in range(work.num_chunks):
        summary = summaries[chunk]
        for shard_id, count in zip(work.chunk_range(chunk), summary.counts):
            counts[shards[shard_id]] = count
        for name in summary.part_names:
            if len(part_names) < MAX_PART_NAMES:
                part_names.setdefault(name)
    return PrepareResult(
        shard_counts=counts,
        part_names=list(part_names),
        first_samples=summaries[0].first_samples if summaries else [],
    )


def _assign_splits(shards: list[str], splits: SplitOptions) -> dict[str, list[str]]:
    if splits.patterns:
        return split_by_patterns(shards, splits.patterns)
    ratio = splits.ratio
    if ratio is None:
        ratio = [("train", 1.0), ("val", 0.0), ("test", 0.0)]
    return split_by_ratio(shards, ratio, splits.shuffle_seed)


def _publish(
    root: Path,
    shards: list[str],
    staging: _Staging,
    result: PrepareResult,
    split_config: str,
    tar_index_only: bool,
    before_info: Callable[[], None],
) -> None:
    """Move every staged file into place; ``before_info`` (``dataset.yaml``) next, and
    ``.info.json`` last (it marks a prepared dataset)."""
    meta = nv_meta_dir(root)
    mode_like = root / shards[0]
    work = staging.work
    assert work is not None
    for chunk in range(work.num_chunks):
        for shard_id, path in work.chunk_files(chunk, "idx", ".idx"):
            target = root / tar_index_path(shards[shard_id])
            if not target.parent.is_dir():  # a remote prepare's staging folder has no shards
                target.parent.mkdir(parents=True)
            copy_permissions(mode_like, path)
            publish_file(path, target)
    _stage_checksums(root, shards, staging, work)
    _publish_checksums(staging, meta / CHECKSUMS_FOLDER_NAME)
    if staging.sqlite_tmp is not None:
        _publish_sqlite(staging, meta / INDEX_SQLITE_FILENAME, mode_like)
    else:  # --no-sample-tables: an old index would describe the shards as they were
        remove_quietly(meta / INDEX_SQLITE_FILENAME)
    write_index_uuid(root, mode_like=mode_like)
    if tar_index_only:
        before_info()
        _convert_legacy_info(root, mode_like)
        if (meta / split_config).is_file() and (meta / INFO_JSON_FILENAME).is_file():
            write_shard_table(root, split_config)
        return
    write_split(root, result.split_parts or {}, (), split_config, mode_like=mode_like)
    info_text = info_json_text(result.shard_counts, current_energon_version())
    write_shard_table(root, split_config, info_text=info_text)
    before_info()
    write_info(root, result.shard_counts, current_energon_version(), mode_like=mode_like)


def _stage_checksums(root: Path, shards: list[str], staging: _Staging, work: WorkFolder) -> None:
    """With ``--checksums``: the new checksums folder, filled from the chunks (not yet
    published)."""
    if not (work.chunk_folder(0) / "crc").is_dir():
        return
    staging.checksum_dir = nv_meta_dir(root) / f".{CHECKSUMS_FOLDER_NAME}.{staging.run_id}.tmp"
    for chunk in range(work.num_chunks):
        for shard_id, path in work.chunk_files(chunk, "crc", CHECKSUMS_SUFFIX):
            rel = checksum_rel_path(shards[shard_id]).split("/", 2)[2]  # below the folder
            target = staging.checksum_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            publish_file(path, target)


def _publish_checksums(staging: _Staging, target: Path) -> None:
    """The new checksums folder replaces the old one; without new checksums the old ones go
    (they would describe shards as they were)."""
    old = target.with_name(f".{target.name}.{staging.run_id}.old")
    if target.exists():
        os.replace(target, old)
    if staging.checksum_dir is not None:
        staging.checksum_dir.mkdir(exist_ok=True)
        os.replace(staging.checksum_dir, target)
        staging.checksum_dir = None
    shutil.rmtree(old, ignore_errors=True)


def _publish_sqlite(staging: _Staging, target: Path, mode_like: Path) -> None:
    """Move the finished index into place: renamed where it can be (the work folder, or a
    ``--tmp-path`` on the same file system), else copied next to the target first."""
    built = staging.sqlite_tmp
    assert built is not None
    copy_permissions(mode_like, built)
    try:
        os.replace(built, target)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        local_tmp = temp_name_for(target)  # another file system: copy, then rename
        try:
            shutil.copyfile(built, local_tmp)
            copy_permissions(mode_like, local_tmp)
            os.replace(local_tmp, target)
        except BaseException:
            remove_quietly(local_tmp)
            raise
        remove_quietly(built)
    staging.sqlite_tmp = None


def _convert_legacy_info(root: Path, mode_like: Path) -> None:
    """``--tar-index-only`` turns a legacy ``.info.yaml`` into ``.info.json`` (content unchanged)."""
    if (nv_meta_dir(root) / INFO_JSON_FILENAME).is_file():
        return
    try:
        info = read_dataset_info(root)
    except DatasetInfoError:
        return
    write_info(root, info.shard_counts, info.energon_version, mode_like=mode_like)


# ---------------------------------------------------------------------------------------------
# Remote datasets (s3://)


def _prepare_remote(root: str, job: _PrepareJob) -> PrepareResult:
    """Prepare the dataset at the remote ``root`` by running the local pipeline on a staging folder.

    The staging folder (in ``tmp_path`` or the system temp dir) mirrors the dataset's layout: the
    workers stream each shard once into a temporary file there, scan it and write its ``.tar.idx``;
    ``index.sqlite`` and the other metadata are built there exactly as for a local dataset. Only
    then is anything uploaded: the ``.tar.idx`` files next to the shards, the checksums, then
    ``index.sqlite``, ``index.uuid``, the split config and the shard table, and ``.info.json``
    last, each through a temporary object and a copy (``before_info``, i.e. ``dataset.yaml``, is
    written before any upload). An interrupted run leaves the previous remote metadata readable
    (and is not continued: the staging folder is temporary). There is no lock (object stores have
    no cheap one): do not run two prepares of one remote dataset at once.
    """
    shard_list = job.resolve_shards(root)
    scan, splits = job.scan, job.splits
    tmp_path = scan.tmp_path
    if tmp_path is not None:
        Path(tmp_path).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix="energon-prepare-", dir=str(tmp_path) if tmp_path is not None else None
    ) as stage_dir:
        stage = Path(stage_dir) / "dataset"
        nv_meta_dir(stage).mkdir(parents=True)
        fetched = _fetch_existing(root, stage, splits.split_config, job.tar_index_only, scan)
        staging = _Staging(run_id=uuid.uuid4().hex[:12])
        try:
            result = _index_shards(
                stage, shard_list, staging, dataclasses.replace(scan, tmp_path=None), root
            )
            if not job.tar_index_only:
                result.split_parts = _assign_splits(shard_list, splits)
            _publish(
                stage,
                shard_list,
                staging,
                result,
                splits.split_config,
                job.tar_index_only,
                lambda: job.run_before_info(result, stage),
            )
        except BaseException:
            staging.cleanup(interrupted=False)
            raise
        _upload_prepared(stage, root, shard_list, splits.split_config, fetched, scan.progress)
    return result


def _fetch_existing(
    root: str, stage: Path, split_config: str, tar_index_only: bool, scan: ScanOptions
) -> dict[str, bytes]:
    """Existing metadata the local pipeline reads (the media tables of the old index, a legacy
    info file, the split config of ``--tar-index-only``), downloaded into the staging folder."""
    meta, meta_url = nv_meta_dir(stage), epath.join(root, MAIN_FOLDER_NAME)
    fetched: dict[str, bytes] = {}
    wanted = [INFO_JSON_FILENAME, INFO_YAML_FILENAME]
    if tar_index_only:  # the shard table is written again from the split config
        wanted.append(split_config)
    if scan.media_filter is None and scan.sample_tables:
        wanted.append(INDEX_SQLITE_FILENAME)
    for name in wanted:
        url = epath.join(meta_url, name)
        if epath.is_file(url):
            epath.download(url, str(meta / name))
            fetched[name] = (meta / name).read_bytes()
    return fetched


def _upload_prepared(
    stage: Path,
    root: str,
    shards: list[str],
    split_config: str,
    fetched: dict[str, bytes],
    progress: bool,
) -> None:
    """Upload the staged metadata; ``.info.json`` last (it marks the dataset as prepared)."""
    from concurrent.futures import ThreadPoolExecutor

    def upload(rel: str) -> None:
        epath.upload(str(stage / rel), epath.join(root, rel))

    index_files = [tar_index_path(shard) for shard in shards]
    checksum_files = [checksum_rel_path(shard) for shard in shards]
    if not (stage / MAIN_FOLDER_NAME / CHECKSUMS_FOLDER_NAME).is_dir():
        checksum_files = []
    checksums_url = epath.join(root, MAIN_FOLDER_NAME, CHECKSUMS_FOLDER_NAME)
    stale = set(epath.walk(checksums_url)) - {epath.join(root, f) for f in checksum_files}
    with ThreadPoolExecutor(max_workers=8) as pool:
        for files, action, what in (
            (index_files, upload, "Uploading tar indices"),
            (checksum_files, upload, "Uploading checksums"),
            (sorted(stale), epath.remove, "Removing old checksums"),
        ):
            list(
                tqdm(
                    pool.map(action, files),
                    total=len(files),
                    desc=what,
                    unit="file",
                    disable=not progress or not files,
                )
            )
    meta = nv_meta_dir(stage)
    ordered = [
        INDEX_SQLITE_FILENAME,
        INDEX_UUID_FILENAME,
        split_config,
        SHARD_TABLE_FILENAME,
        INFO_YAML_FILENAME,
        INFO_JSON_FILENAME,
    ]
    for name in ordered:
        path = meta / name
        if not path.is_file() or fetched.get(name) == path.read_bytes():
            continue  # not produced, or unchanged from what was there
        upload(f"{MAIN_FOLDER_NAME}/{name}")
