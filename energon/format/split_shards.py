"""Which shards (and which samples) a split of a prepared WebDataset reads.

Two ways to the same answer. :func:`open_split_shards` takes the prepared shard table when it
describes the dataset as it is now: a rank then reads a fixed front part and, later, the blocks
of its own shards (:mod:`energon.format.shard_table`). Otherwise it reads ``.info.json`` and the
split config in full and brace-expands every shard name (:func:`listed_split`), as the reference
does. :func:`write_shard_table` (run by ``prepare``, or ``energon prepare --shard-table-only``
after editing the split config) writes the table from that second way's answer.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

from energon import epath
from energon.format.info import read_dataset_info
from energon.format.layout import (
    CHECKSUMS_FOLDER_NAME,
    INDEX_SQLITE_FILENAME,
    INDEX_UUID_FILENAME,
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SHARD_TABLE_FILENAME,
    PathLike,
    atomic_write_bytes,
    nv_meta_dir,
)
from energon.format.shard_index import ListedShards, ShardIndex
from energon.format.shard_table import (
    SplitShards,
    StaleTable,
    open_shard_table,
    read_table_header,
    shard_table_bytes,
    split_config_sha256,
    split_table,
)
from energon.format.split import SplitConfig, read_split, warn_unmatched_exclude
from energon.format.sqlite_index import sample_indices_of, sample_tables_path

#: Datasets with at least this many shards and no usable shard table get a warning: every rank
#: reads the whole shard list at start-up.
WARN_WITHOUT_TABLE = 10_000


@dataclass
class OpenedSplit:
    """A split's shards, the global indices of its excluded samples, and whether the dataset
    has sample checksums."""

    shards: ShardIndex
    excluded: frozenset[int]
    checksums: bool


def open_split_shards(root: str, split_part: str, split_config: str) -> OpenedSplit:
    """The shards of split ``split_part`` of the prepared dataset at ``root`` (a normalised local
    path or URL), from the shard table if it matches, else from ``.info.json``."""
    meta = epath.join(root, MAIN_FOLDER_NAME)
    try:
        info_size, _ = epath.stat(epath.join(meta, INFO_JSON_FILENAME))
    except FileNotFoundError:  # a legacy .info.yaml only
        opened: tuple | StaleTable = StaleTable(f"no {INFO_JSON_FILENAME}")
    else:
        opened = open_shard_table(root, split_config, info_size)
    if not isinstance(opened, StaleTable):
        header = opened[0]
        for text in header["warnings"]:
            warnings.warn(text, UserWarning, stacklevel=3)
        table = split_table(opened, split_part, epath.join(meta, split_config))
        return OpenedSplit(table, frozenset(table.excluded.tolist()), _has_checksums(root, header))
    split = listed_split(root, split_part, split_config)
    if opened.reason != "no shard table" or split.shards.num_shards >= WARN_WITHOUT_TABLE:
        warnings.warn(
            f"{root}: {opened.reason}: every rank reads all {split.shards.num_shards:,} shards of "
            f"split {split_part!r} at start-up; `energon prepare --shard-table-only {root}` "
            "writes a shard table so that each rank reads only its own",
            UserWarning,
            stacklevel=3,
        )
    return split


def startup_summary(root: str, split_config: str) -> dict[str, int]:
    """The metadata files that every rank reads in :func:`open_split_shards` (name in
    ``.nv-meta`` -> bytes read; ``.info.json`` is only asked for its size where a shard table
    is current): ``index.uuid``, the split config and the table's front part with a current
    table; ``.info.json`` and the split config in full without one. What a rank reads of its own
    shards comes on top (:mod:`energon.source.startup_reads`)."""
    meta = epath.join(root, MAIN_FOLDER_NAME)
    split_size = len(epath.read_bytes(epath.join(meta, split_config)))
    info = epath.join(meta, INFO_JSON_FILENAME)
    try:
        info_size, _ = epath.stat(info)
    except FileNotFoundError:  # a legacy .info.yaml only: read in full, as the fallback does
        legacy, _ = epath.stat(epath.join(meta, INFO_YAML_FILENAME))
        return {INFO_YAML_FILENAME: legacy, split_config: split_size}
    opened = open_shard_table(root, split_config, info_size)
    if isinstance(opened, StaleTable):
        return {INFO_JSON_FILENAME: info_size, split_config: split_size}
    uuid = epath.read_bytes(epath.join(meta, INDEX_UUID_FILENAME))
    return {
        INDEX_UUID_FILENAME: len(uuid),
        split_config: split_size,
        SHARD_TABLE_FILENAME: len(opened[2]),
    }


def _has_checksums(root: str, header: dict) -> bool:
    """Whether to verify samples: the table says so, and (locally, where asking costs a stat and
    not a listing) the folder is there: a re-prepare killed while it swapped the folders has
    none for a moment, and then the shards are read unchecked, as without a table."""
    if epath.is_remote(root):
        return bool(header["checksums"])
    return bool(header["checksums"]) and epath.is_dir(
        epath.join(root, MAIN_FOLDER_NAME, CHECKSUMS_FOLDER_NAME)
    )


def listed_split(root: str, split_part: str, split_config: str) -> OpenedSplit:
    """The split from ``.info.json`` and the split config, read in full."""
    split = read_split(root, split_config)
    counts_by_shard = read_dataset_info(root).shard_counts
    return OpenedSplit(
        _listed_shards(root, split, split_part, counts_by_shard),
        _resolve_sample_excludes(root, split, split_part, counts_by_shard),
        epath.is_dir(epath.join(root, MAIN_FOLDER_NAME, CHECKSUMS_FOLDER_NAME)),
    )


def _listed_shards(
    root: str, split: SplitConfig, split_part: str, counts_by_shard: dict[str, int]
) -> ListedShards:
    names = split.shards(split_part)
    missing = [s for s in names if s not in counts_by_shard]
    if missing:
        raise ValueError(
            f"{root}: split {split_part!r} lists shards that are not in "
            f"{epath.join(root, MAIN_FOLDER_NAME, INFO_JSON_FILENAME)}: "
            f"{missing[:5]} (re-run `energon prepare`)"
        )
    tar_ids = {name: i for i, name in enumerate(counts_by_shard)}
    return ListedShards(names, [counts_by_shard[s] for s in names], [tar_ids[s] for s in names])


def _resolve_sample_excludes(
    root: str, split: SplitConfig, split_part: str, counts_by_shard: dict[str, int]
) -> frozenset[int]:
    """Global indices of the split's ``<shard>/<key>`` excludes (looked up in the sqlite index)."""
    names = split.shards(split_part)
    position = {name: i for i, name in enumerate(names)}
    wanted = sorted((s, k) for s, k in split.sample_excludes() if s in position)
    if not wanted:
        return frozenset()
    tar_ids = {name: i for i, name in enumerate(counts_by_shard)}
    starts = ListedShards(names, [counts_by_shard[s] for s in names])
    sqlite_path = sample_tables_path(root, f"excluding samples by key ({split.source})")
    found = set()
    inner = sample_indices_of(sqlite_path, [(tar_ids[s], k) for s, k in wanted])
    for (shard_name, key), index in zip(wanted, inner):
        if index is None:
            warn_unmatched_exclude(
                split.source, f"{shard_name}/{key}", f"{shard_name} has no sample {key!r}"
            )
            continue
        found.add(starts.start(position[shard_name]) + index)
    return frozenset(found)


def write_shard_table(
    root: PathLike,
    split_config: str,
    *,
    info_text: str | None = None,
    checksums: bool | None = None,
    **levels: int,
) -> None:
    """Write ``.nv-meta/shard_table.bin`` for the local dataset at ``root`` from its
    ``.info.json`` (or ``info_text``, the content about to be written), ``index.uuid`` and the
    split config ``split_config`` (every split in it). ``checksums``: whether the dataset has
    sample checksums (default: whether the folder exists). ``levels``: ``block_shards`` and
    ``max_pages`` of :func:`~energon.format.shard_table.shard_table_bytes` (tests)."""
    meta = nv_meta_dir(root)
    if info_text is None:
        info_text = (meta / INFO_JSON_FILENAME).read_text(encoding="utf-8")
        counts_by_shard = read_dataset_info(root).shard_counts
    else:
        counts_by_shard = json.loads(info_text)["shard_counts"]
    split_bytes = (meta / split_config).read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = read_split(root, split_config)
        splits = {
            name: SplitShards(
                split.shards(name),
                sorted(_resolve_sample_excludes(str(root), split, name, counts_by_shard)),
            )
            for name in split.split_parts
        }
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    data = shard_table_bytes(
        counts_by_shard,
        splits,
        index_uuid=(meta / INDEX_UUID_FILENAME).read_text(encoding="utf-8").strip(),
        info_size=len(info_text.encode()),
        split_config=split_config,
        split_sha256=split_config_sha256(split_bytes),
        checksums=(meta / CHECKSUMS_FOLDER_NAME).is_dir() if checksums is None else checksums,
        warnings=[str(w.message) for w in caught],
        **levels,
    )
    atomic_write_bytes(meta / SHARD_TABLE_FILENAME, data, mode_like=meta / split_config)


def refresh_shard_table(root: PathLike) -> None:
    """Write the shard table of a local dataset again, for the split config it was made for
    (after something else gave the dataset a new ``index.uuid``); nothing if it has none."""
    meta = nv_meta_dir(root)
    try:
        split_config = read_table_header(str(meta / SHARD_TABLE_FILENAME))[0]["split_config"]
    except (OSError, ValueError, KeyError):
        return  # none (or not one we can read): nothing to keep in step
    if (meta / split_config).is_file() and (meta / INFO_JSON_FILENAME).is_file():
        write_shard_table(root, split_config)


def write_shard_table_for(root: str | PathLike, split_config: str) -> None:
    """``energon prepare --shard-table-only``: (re)write the shard table of a prepared dataset
    from its ``.info.json`` and split config, locally or in object storage (the few metadata
    files are fetched into a temporary folder, the table is uploaded)."""
    if not epath.is_remote(root):
        write_shard_table(root, split_config)
        return
    import tempfile

    meta_url = epath.join(root, MAIN_FOLDER_NAME)
    with tempfile.TemporaryDirectory(prefix="energon-shard-table-") as stage:
        meta = nv_meta_dir(stage)
        meta.mkdir()
        for name in (INFO_JSON_FILENAME, INDEX_UUID_FILENAME, split_config):
            epath.download(epath.join(meta_url, name), str(meta / name))
        split = read_split(stage, split_config)
        if split.sample_excludes():  # looked up in the sample index
            sqlite_url = epath.join(meta_url, INDEX_SQLITE_FILENAME)
            epath.download(sqlite_url, str(meta / INDEX_SQLITE_FILENAME))
        checksums = epath.is_dir(epath.join(meta_url, CHECKSUMS_FOLDER_NAME))
        write_shard_table(stage, split_config, checksums=checksums)
        epath.upload(str(meta / SHARD_TABLE_FILENAME), epath.join(meta_url, SHARD_TABLE_FILENAME))
