"""``prepare``: scan a WebDataset's shards once and write its ``.nv-meta`` metadata.

Shards are scanned in parallel worker processes, each reading only tar headers. Results are
aggregated in the order of the shard list (which defines ``tar_file_id``), so the output does not
depend on which worker finished first.

Nothing is published until every shard was scanned: tar indices, checksums and ``index.sqlite``
are built under temporary names, then renamed into place; ``dataset.yaml`` (the caller's
``before_info`` step) comes next and ``.info.json`` (the "this dataset is prepared" marker) is
written last, so a killed run never leaves a dataset that looks prepared without the rest. A
failed run leaves the previous metadata as it was.

One prepare at a time per dataset folder: a run holds an exclusive lock
(``.nv-meta/.prepare.lock``, ``flock``; released by the kernel even on ``kill -9``) and, holding it,
first removes the temporary files that killed runs left behind.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
import uuid
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from tqdm import tqdm

from energon import epath
from energon.errors import EmptyShardError, PrepareError, ShardReadError
from energon.format.checksums import checksum_rel_path, encode_checksums, sample_checksums
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
from energon.format.split import expand_all, expand_braces, write_split
from energon.format.split_shards import write_shard_table
from energon.format.sqlite_index import SqliteIndexWriter, write_index_uuid
from energon.format.tar import scan_tar
from energon.format.tar_index import encode_offsets, tar_index_path
from energon.media.extract import MediaFilterConfig
from energon.media.prepare import media_rows_for_samples

SHARD_SUFFIXES = (".tar", ".tgz")
MAX_PART_NAMES = 50
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


def split_by_ratio(
    shards: Sequence[str],
    ratios: Sequence[tuple[str, float]],
    shuffle_seed: int | None = None,
) -> dict[str, list[str]]:
    """Assign whole shards to splits by ratio (cumulative boundaries, rounded down).

    Boundaries are computed with exact fractions of the decimal ratios, so ``7,2,1`` over 10 shards
    gives 7/2/1 shards (floating cumulative sums would round 0.7+0.2 down and lose a shard).
    ``shuffle_seed`` shuffles the shard list first with ``random.Random(seed)`` (reference-compatible).
    """
    if not ratios or any(r < 0 for _, r in ratios) or sum(r for _, r in ratios) <= 0:
        raise ValueError(f"invalid split ratios {list(ratios)}: need non-negative values, sum > 0")
    order = list(shards)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    exact = [Fraction(repr(float(r))) for _, r in ratios]
    total = sum(exact)
    result: dict[str, list[str]] = {}
    start = 0
    cumulative = Fraction(0)
    for (name, _), ratio in zip(ratios, exact):
        cumulative += ratio
        end = int(len(order) * cumulative / total)
        result[name] = order[start:end]
        start = end
    return result


def split_by_patterns(
    shards: Sequence[str], patterns: Sequence[tuple[str, str]]
) -> dict[str, list[str]]:
    """Assign shards to splits by regular expression (``re.match`` on the relative path).

    Each pattern may contain braces and is expanded into several regexes. A shard can land in
    several splits, or in none.
    """
    result: dict[str, list[str]] = {}
    for name, pattern in patterns:
        regexes = [re.compile(p) for p in expand_braces(pattern)]
        matched = [s for s in shards if any(r.match(s) for r in regexes)]
        result.setdefault(name, []).extend(s for s in matched if s not in result[name])
    return result


# ---------------------------------------------------------------------------------------------
# Scanning one shard (runs in a worker process)


@dataclass
class ShardScanResult:
    """One shard's index, in compact arrays so it is cheap to send back from a worker."""

    shard_id: int
    keys: list[str]
    offsets: array  # 'Q', len(keys) + 1 entries: the .tar.idx content
    part_sample_index: array  # 'L', one per part
    part_names: list[str]  # one per part (interned strings, pickled once each)
    part_offsets: array  # 'Q'
    part_sizes: array  # 'Q'
    found_parts: list[str] = field(default_factory=list)  # distinct part names, first-seen order
    media_rows: list[tuple[str, str, str]] = field(default_factory=list)  # with media_filter

    def part_columns(self) -> tuple[array, list[str], array, array]:
        return self.part_sample_index, self.part_names, self.part_offsets, self.part_sizes


@dataclass(frozen=True)
class _ShardTask:
    shard_id: int
    tar_path: str
    index_tmp_path: str | None  # where to write the .tar.idx (renamed into place by the parent)
    media_filter: MediaFilterConfig | None = None  # also compute media metadata of the parts
    download_dir: str | None = None  # remote shards are streamed into a temporary file here
    checksum_tmp_path: str | None = None  # prepare --checksums: where to write the checksums


def _scan_shard(task: _ShardTask) -> ShardScanResult:
    """Scan one shard's headers, write its tar index to the temporary path, return its rows.

    A remote shard (``s3://``) is streamed once into a temporary local file, which is scanned
    (and read for media metadata) like a local shard and deleted afterwards.
    """
    if not epath.is_remote(task.tar_path):
        return _scan_local_shard(task, task.tar_path)
    fd, local = tempfile.mkstemp(dir=task.download_dir, prefix=".shard-", suffix=".tar")
    os.close(fd)
    try:
        try:
            epath.download(task.tar_path, local)
        except OSError as e:
            raise ShardReadError(f"{task.tar_path}: cannot read shard: {e}") from None
        return _scan_local_shard(task, local)
    finally:
        remove_quietly(local)


def _scan_local_shard(task: _ShardTask, local_path: str) -> ShardScanResult:
    try:
        scan = scan_tar(local_path, display_path=task.tar_path)
    except OSError as e:
        raise ShardReadError(f"{task.tar_path}: cannot read shard: {e.strerror or e}") from None
    if not scan.samples:
        raise EmptyShardError(
            f"{task.tar_path}: shard contains no samples (no members named '<key>.<part>'); "
            "remove it or exclude it with --exclude"
        )
    offsets = array("Q", scan.sample_offsets())
    index_bytes = encode_offsets(offsets)
    if task.index_tmp_path is not None:
        with open(task.index_tmp_path, "wb") as f:
            f.write(index_bytes)
    if task.checksum_tmp_path is not None:
        sums = sample_checksums(local_path, offsets)
        os.makedirs(os.path.dirname(task.checksum_tmp_path), exist_ok=True)
        with open(task.checksum_tmp_path, "wb") as f:
            f.write(encode_checksums(index_bytes, sums))
    result = _compact_result(task.shard_id, scan.samples, offsets)
    if task.media_filter is not None:
        # same worker, same pass over the shard: the payloads are read while the file is hot
        with open(local_path, "rb") as f:
            result.media_rows = media_rows_for_samples(f, scan.samples, task.media_filter)
    return result


def _compact_result(shard_id: int, samples: list, offsets: array) -> ShardScanResult:
    interned: dict[str, str] = {}
    part_sample_index = array("L")
    part_names: list[str] = []
    part_offsets = array("Q")
    part_sizes = array("Q")
    for sample_index, (_, _, parts) in enumerate(samples):
        for part, data_offset, size in parts:
            part_sample_index.append(sample_index)
            part_names.append(interned.setdefault(part, part))
            part_offsets.append(data_offset)
            part_sizes.append(size)
    return ShardScanResult(
        shard_id=shard_id,
        keys=[s[0] for s in samples],
        offsets=offsets,
        part_sample_index=part_sample_index,
        part_names=part_names,
        part_offsets=part_offsets,
        part_sizes=part_sizes,
        found_parts=list(interned)[:MAX_PART_NAMES],
    )


def _iter_scans_in_order(tasks: list[_ShardTask], num_workers: int) -> Iterator[ShardScanResult]:
    """Scan shards in parallel and yield results in task order (buffering early finishers).

    The pool is started before this returns (not lazily inside the generator), so it is forked
    before any progress-bar thread exists.
    """
    if num_workers <= 1 or len(tasks) <= 1:
        return (_scan_shard(task) for task in tasks)
    remote = any(epath.is_remote(t.tar_path) for t in tasks)
    pool = process_context(remote).Pool(min(num_workers, len(tasks)))
    return _ordered_results(pool, tasks)


def _ordered_results(pool, tasks: list[_ShardTask]) -> Iterator[ShardScanResult]:
    pending: dict[int, ShardScanResult] = {}
    next_id = 0
    try:
        for result in pool.imap_unordered(_scan_shard, tasks, chunksize=1):
            pending[result.shard_id] = result
            while next_id in pending:
                yield pending.pop(next_id)
                next_id += 1
        pool.close()
    finally:
        pool.terminate()
        pool.join()


# ---------------------------------------------------------------------------------------------
# The whole preparation


@dataclass
class _Staging:
    """Temporary files of one run, published together on success or removed on failure."""

    run_id: str
    index_tmps: dict[str, str] = field(default_factory=dict)  # final .tar.idx path -> tmp path
    sqlite_tmp: Path | None = None
    checksum_dir: Path | None = None  # prepare --checksums: the new checksums folder, filled

    def cleanup(self) -> None:
        for tmp in self.index_tmps.values():
            remove_quietly(tmp)
        if self.sqlite_tmp is not None:
            remove_quietly(self.sqlite_tmp)
        if self.checksum_dir is not None:
            shutil.rmtree(self.checksum_dir, ignore_errors=True)


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
    before_info: BeforeInfo | None = None,
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
    ``before_info(result, staged_root)`` runs after everything else was written and before
    ``.info.json``: the CLI writes ``dataset.yaml`` there, so a killed run never leaves a dataset
    that looks prepared but lacks it (``staged_root`` holds the new metadata: ``root``, or the
    local staging folder of a remote prepare).

    An ``s3://`` root is prepared remotely: see :func:`_prepare_remote`.

    Raises :class:`PrepareError` (empty or unreadable shard), :class:`TarFormatError` (corrupt or
    truncated tar, with file and byte offset) or ``DuplicateSampleKeyError`` (both locations).
    """
    if epath.is_remote(root):
        return _prepare_remote(
            epath.normalize(root),
            shards,
            split_parts_ratio=split_parts_ratio,
            split_parts_patterns=split_parts_patterns,
            split_config=split_config,
            shuffle_seed=shuffle_seed,
            exclude=exclude,
            num_workers=num_workers,
            tar_index_only=tar_index_only,
            progress=progress,
            tmp_path=tmp_path,
            media_filter=media_filter,
            checksums=checksums,
            before_info=before_info,
        )
    root = Path(root)
    if not root.is_dir():
        raise PrepareError(f"{root}: not a directory")
    meta = nv_meta_dir(root)
    created_meta = not meta.exists()
    meta.mkdir(exist_ok=True)
    _copy_dir_mode(root, meta)
    staging = _Staging(run_id=uuid.uuid4().hex[:12])
    try:
        with prepare_lock(root):
            shard_list = _resolve_shards(root, shards, exclude, tar_index_only)
            _check_index_names_unique(shard_list)
            remove_stale_temp_files(root, shard_list)
            result = _index_shards(
                root, shard_list, staging, num_workers, progress, tmp_path, media_filter, checksums
            )
            split_parts = None
            if not tar_index_only:
                split_parts = _assign_splits(
                    shard_list, split_parts_ratio, split_parts_patterns, shuffle_seed
                )
            result.split_parts = split_parts
            _publish(
                root,
                shard_list,
                staging,
                result,
                split_config,
                tar_index_only,
                lambda: before_info(result, root) if before_info is not None else None,
            )
    except BaseException:
        staging.cleanup()
        if created_meta and not any(meta.iterdir()):
            meta.rmdir()
        raise
    return result


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
    num_workers: int | None,
    progress: bool,
    tmp_path: PathLike | None,
    media_filter: MediaFilterConfig | None = None,
    checksums: bool = False,
    source_root: str | None = None,
) -> PrepareResult:
    """Scan all shards and fill a temporary ``index.sqlite``; nothing is published yet.

    ``source_root``: where the shards are read from when that is not ``root`` (remote prepare:
    ``root`` is then the local staging folder and the shards are ``source_root/<shard>`` URLs).
    """
    tasks = []
    download_dir = str(root) if source_root is not None else None
    if checksums:
        folder = f".{CHECKSUMS_FOLDER_NAME}.{staging.run_id}.tmp"
        staging.checksum_dir = nv_meta_dir(root) / folder
    for shard_id, shard in enumerate(shards):
        final_index = str(root / tar_index_path(shard))
        if source_root is not None:
            os.makedirs(os.path.dirname(final_index), exist_ok=True)
        staging.index_tmps[final_index] = f"{final_index}.{staging.run_id}.tmp"
        tar_path = epath.join(source_root, shard) if source_root is not None else str(root / shard)
        checksum_tmp = None
        if staging.checksum_dir is not None:
            rel = checksum_rel_path(shard).split("/", 2)[2]  # below the checksums folder
            checksum_tmp = str(staging.checksum_dir / rel)
        tasks.append(
            _ShardTask(
                shard_id,
                tar_path,
                staging.index_tmps[final_index],
                media_filter,
                download_dir,
                checksum_tmp,
            )
        )
    sqlite_dir = Path(tmp_path) if tmp_path is not None else nv_meta_dir(root)
    sqlite_dir.mkdir(parents=True, exist_ok=True)
    staging.sqlite_tmp = temp_name_for(sqlite_dir / INDEX_SQLITE_FILENAME)
    counts: dict[str, int] = {}
    part_names: dict[str, None] = {}
    first_samples: list[tuple[str, list[str]]] = []
    # Start the worker processes before opening the database, so they do not inherit it.
    scans = _iter_scans_in_order(
        tasks, num_workers if num_workers is not None else _default_num_workers()
    )
    writer = SqliteIndexWriter(staging.sqlite_tmp, shards)
    try:
        for scan in tqdm(
            scans, total=len(tasks), desc="Indexing shards", unit="shard", disable=not progress
        ):
            writer.add_shard(scan.shard_id, scan.keys, scan.offsets, *scan.part_columns())
            if scan.media_rows:
                writer.add_media_rows(scan.media_rows)
            counts[shards[scan.shard_id]] = len(scan.keys)
            for name in scan.found_parts:
                if len(part_names) < MAX_PART_NAMES:
                    part_names.setdefault(name)
            if scan.shard_id == 0:
                first_samples = _first_samples(scan)
        if media_filter is None:
            writer.copy_media_tables_from(nv_meta_dir(root) / INDEX_SQLITE_FILENAME)
        else:
            writer.add_media_filter(media_filter.strategy.value, media_filter.patterns_column)
        writer.close()
    except BaseException:
        writer.abort()
        if hasattr(scans, "close"):
            scans.close()  # stops the worker pool
        raise
    return PrepareResult(
        shard_counts=counts, part_names=list(part_names), first_samples=first_samples
    )


def _first_samples(scan: ShardScanResult, n: int = 2) -> list[tuple[str, list[str]]]:
    wanted = {i: (scan.keys[i], []) for i in range(min(n, len(scan.keys)))}
    for sample_index, name in zip(scan.part_sample_index, scan.part_names):
        if sample_index >= n:
            break
        wanted[sample_index][1].append(name)
    return [wanted[i] for i in sorted(wanted)]


def _assign_splits(
    shards: list[str],
    ratio: Sequence[tuple[str, float]] | None,
    patterns: Sequence[tuple[str, str]] | None,
    shuffle_seed: int | None,
) -> dict[str, list[str]]:
    if patterns:
        return split_by_patterns(shards, patterns)
    if ratio is None:
        ratio = [("train", 1.0), ("val", 0.0), ("test", 0.0)]
    return split_by_ratio(shards, ratio, shuffle_seed)


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
    for final, tmp in list(staging.index_tmps.items()):
        copy_permissions(mode_like, tmp)
        os.replace(tmp, final)
        del staging.index_tmps[final]
    _publish_checksums(staging, meta / CHECKSUMS_FOLDER_NAME)
    _publish_sqlite(staging, meta / INDEX_SQLITE_FILENAME, mode_like)
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
    tmp = staging.sqlite_tmp
    assert tmp is not None
    if tmp.parent != target.parent:  # built elsewhere (--tmp-path): copy next to the target first
        local_tmp = temp_name_for(target)
        try:
            shutil.copyfile(tmp, local_tmp)
        except BaseException:
            remove_quietly(local_tmp)
            raise
        remove_quietly(tmp)
        staging.sqlite_tmp = tmp = local_tmp
    copy_permissions(mode_like, tmp)
    os.replace(tmp, target)
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


def _prepare_remote(
    root: str,
    shards: Sequence[str] | None,
    *,
    split_parts_ratio: Sequence[tuple[str, float]] | None,
    split_parts_patterns: Sequence[tuple[str, str]] | None,
    split_config: str,
    shuffle_seed: int | None,
    exclude: str | None,
    num_workers: int | None,
    tar_index_only: bool,
    progress: bool,
    tmp_path: PathLike | None,
    media_filter: MediaFilterConfig | None,
    checksums: bool,
    before_info: BeforeInfo | None,
) -> PrepareResult:
    """Prepare the dataset at the remote ``root`` by running the local pipeline on a staging folder.

    The staging folder (in ``tmp_path`` or the system temp dir) mirrors the dataset's layout: the
    workers stream each shard once into a temporary file there, scan it and write its ``.tar.idx``;
    ``index.sqlite`` and the other metadata are built there exactly as for a local dataset. Only
    then is anything uploaded: the ``.tar.idx`` files next to the shards, the checksums, then
    ``index.sqlite``, ``index.uuid`` and the split config, and ``.info.json`` last, each through a
    temporary object and a copy (``before_info``, i.e. ``dataset.yaml``, is written before any
    upload). An interrupted run leaves the previous remote metadata readable. There is no lock
    (object stores have no cheap one): do not run two prepares of one remote dataset at once.
    """
    shard_list = _resolve_shards(root, shards, exclude, tar_index_only)
    _check_index_names_unique(shard_list)
    if tmp_path is not None:
        Path(tmp_path).mkdir(parents=True, exist_ok=True)
    meta_url = epath.join(root, MAIN_FOLDER_NAME)
    with tempfile.TemporaryDirectory(
        prefix="energon-prepare-", dir=str(tmp_path) if tmp_path is not None else None
    ) as stage_dir:
        stage = Path(stage_dir) / "dataset"
        meta = nv_meta_dir(stage)
        meta.mkdir(parents=True)
        # Existing metadata the local pipeline reads: media tables of the old index, legacy info.
        fetched: dict[str, bytes] = {}
        wanted = [INFO_JSON_FILENAME, INFO_YAML_FILENAME]
        if tar_index_only:  # the shard table is written again from the split config
            wanted.append(split_config)
        if media_filter is None:
            wanted.append(INDEX_SQLITE_FILENAME)
        for name in wanted:
            url = epath.join(meta_url, name)
            if epath.is_file(url):
                epath.download(url, str(meta / name))
                fetched[name] = (meta / name).read_bytes()
        staging = _Staging(run_id=uuid.uuid4().hex[:12])
        try:
            result = _index_shards(
                stage,
                shard_list,
                staging,
                num_workers,
                progress,
                None,
                media_filter,
                checksums,
                source_root=root,
            )
            split_parts = None
            if not tar_index_only:
                split_parts = _assign_splits(
                    shard_list, split_parts_ratio, split_parts_patterns, shuffle_seed
                )
            result.split_parts = split_parts
            _publish(
                stage,
                shard_list,
                staging,
                result,
                split_config,
                tar_index_only,
                lambda: before_info(result, stage) if before_info is not None else None,
            )
        except BaseException:
            staging.cleanup()
            raise
        _upload_prepared(stage, root, shard_list, split_config, fetched, progress)
    return result


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
