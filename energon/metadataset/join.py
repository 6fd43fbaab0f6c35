"""Joins: sample-by-sample combination of datasets by sample key, through a prepared join index.

``energon prepare mix.yaml`` writes, for every ``join`` of every split, the file
``<mix>.yaml.cache/join_index_<sha256>.bin`` in the reference's ``JIDX0001`` layout: 8 magic bytes,
an int64 column count, then one row per joined sample of int64 ``(shard, byte offset, byte size)``
triples, one per member (``-1, -1, -1`` for a missing secondary with ``nonmatch: none``). Unlike the
reference, the file name also depends on each member's split and on sorted excludes, so the same
join in two splits gets two indices and every process computes the same name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import struct
from typing import Any

import numpy as np

from energon.errors import SampleException
from energon.format.tar import split_sample_bytes
from energon.metadataset.config import Blend, Join, JoinMember, MetadatasetError, load_metadataset

MAGIC = b"JIDX0001"


@dataclasses.dataclass
class _Member:
    """A join member resolved to its dataset, split and shards."""

    root: str
    split_part: str
    shards: list[str]  # the split's shard list (brace-expanded, excludes not removed)
    excluded_shards: set[str]
    excluded_keys: set[tuple[str, str]]
    nonmatch: str
    dataset_config: str
    split_config: str
    name: str | None


def _resolve_member(member: JoinMember, base_dir: str, split_part: str) -> _Member:
    from energon.format.split import read_split

    root = (
        member.path
        if os.path.isabs(member.path)
        else os.path.normpath(os.path.join(base_dir, member.path))
    )
    if not os.path.isdir(os.path.join(root, ".nv-meta")):
        raise FileNotFoundError(
            f"join member {root} is not a prepared dataset (run `energon prepare {root}`)"
        )
    split = read_split(root, member.split_config or "split.yaml")
    part = member.split_part or split_part
    if part not in split.split_parts:
        raise MetadatasetError(
            f"join member {root}: no split {part!r}; splits: {sorted(split.split_parts)}"
        )
    shards = list(split.split_parts[part])
    return _Member(
        root=root,
        split_part=part,
        shards=shards,
        excluded_shards=set(split.exclude) & set(shards),
        excluded_keys={pair for pair in split.sample_excludes() if pair[0] in shards},
        nonmatch=member.nonmatch,
        dataset_config=member.dataset_config or "dataset.yaml",
        split_config=member.split_config or "split.yaml",
        name=member.name,
    )


def join_index_name(members: list[_Member]) -> str:
    from energon.format.sqlite_index import read_index_uuid

    digest = hashlib.sha256()
    for m in members:
        try:
            uuid = read_index_uuid(m.root)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{m.root}/.nv-meta/index.uuid is missing: re-prepare it (`energon prepare "
                f"--tar-index-only {m.root}` is enough)"
            ) from None
        digest.update(b"\0uuid=" + uuid.encode())
        digest.update(b"\0split=" + m.split_part.encode())
        digest.update(b"\0excludes=")
        for shard in sorted(m.excluded_shards):
            digest.update(shard.encode() + b"\0")
        for shard, key in sorted(m.excluded_keys):
            digest.update(f"{shard}/{key}".encode() + b"\0")
        digest.update(f"\0nonmatch={m.nonmatch}\0".encode())
    return f"join_index_{digest.hexdigest()}.bin"


def cache_dir(mds_path: str) -> str:
    return os.path.join(os.path.dirname(mds_path), os.path.basename(mds_path) + ".cache")


def build_join_index(members: list[_Member], target: str) -> tuple[int, int]:
    """Write the join index; returns (rows, primary samples). Errors on unmatched ``error`` members."""
    tables = [_member_samples(m) for m in members]
    primary = tables[0]
    columns = [np.stack([primary["shard"], primary["offset"], primary["size"]], axis=1)]
    keep = np.ones(len(primary["key"]), dtype=bool)
    for m, table in zip(members[1:], tables[1:]):
        lookup = {key: i for i, key in enumerate(table["key"])}
        rows = np.full((len(primary["key"]), 3), -1, dtype=np.int64)
        for i, key in enumerate(primary["key"]):
            j = lookup.get(key)
            if j is None:
                if m.nonmatch == "error":
                    raise ValueError(
                        f"join: sample {key!r} of {members[0].root} has no match in {m.root} "
                        f"(split {m.split_part}); use nonmatch: skip or none"
                    )
                if m.nonmatch == "skip":
                    keep[i] = False
                continue
            rows[i] = (table["shard"][j], table["offset"][j], table["size"][j])
        columns.append(rows)
    data = np.concatenate(columns, axis=1)[keep]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<q", len(members)))
        f.write(np.ascontiguousarray(data, dtype="<i8").tobytes())
    os.replace(tmp, target)
    return int(keep.sum()), len(keep)


def _member_samples(m: _Member) -> dict[str, Any]:
    """Samples of the member's split (excludes removed) in split order, from its sqlite index."""
    from energon.format.info import read_info

    tar_ids = {name: i for i, name in enumerate(read_info(m.root))}
    position = {
        tar_ids[s]: i for i, s in enumerate(m.shards) if s in tar_ids and s not in m.excluded_shards
    }
    db = sqlite3.connect(
        f"file:{os.path.join(m.root, '.nv-meta', 'index.sqlite')}?mode=ro", uri=True
    )
    try:
        rows = db.execute(
            "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples"
        ).fetchall()
    finally:
        db.close()
    rows = [
        r
        for r in rows
        if r[0] in position and (m.shards[position[r[0]]], r[1]) not in m.excluded_keys
    ]
    rows.sort(key=lambda r: (position[r[0]], r[2]))
    keys = [r[1] for r in rows]
    if len(set(keys)) != len(keys):
        raise MetadatasetError(
            f"join member {m.root}: sample keys are not unique in split {m.split_part}"
        )
    return {
        "key": keys,
        "shard": np.array([position[r[0]] for r in rows], dtype=np.int64),
        "offset": np.array([r[3] for r in rows], dtype=np.int64),
        "size": np.array([r[4] for r in rows], dtype=np.int64),
    }


def _joins_of(node: Any) -> list[Join]:
    if isinstance(node, Join):
        return [node]
    if isinstance(node, Blend):
        return [j for entry in node.entries for j in _joins_of(entry)]
    return []


def prepare_metadataset(path: str | os.PathLike, *, progress: bool = True) -> list[str]:
    """Build every join index of every split of the metadataset; remove stale ones. Returns a report."""
    path = os.path.abspath(os.fspath(path))
    mds = load_metadataset(path)
    folder = cache_dir(path)
    produced: set[str] = set()
    report: list[str] = []
    for split_part, node in mds.splits.items():
        for join in _joins_of(node):
            members = [
                _resolve_member(m, mds.directory, join.split_part or split_part)
                for m in join.members
            ]
            name = join_index_name(members)
            produced.add(name)
            target = os.path.join(folder, name)
            if os.path.exists(target):
                report.append(f"{split_part}: join index up to date ({name})")
                continue
            rows, total = build_join_index(members, target)
            message = (
                f"Joined all {rows} samples" if rows == total else f"Joined {rows}/{total} samples"
            )
            report.append(f"{split_part}: {message} ({name})")
    if os.path.isdir(folder):
        for stale in sorted(set(os.listdir(folder)) - produced):
            os.remove(os.path.join(folder, stale))
            report.append(f"Cleanup cache file {stale}")
    return report


class JoinLeaf:
    """Rows of a join index as one leaf: loading row ``i`` reads every member's sample bytes
    directly (one pread each), builds each member's sample and calls the joiner."""

    def __init__(
        self, members: list[_Member], index_path: str, joiner: Any, subflavors: dict[str, Any]
    ):
        from energon.source.dataset_config import load_sample_builder

        self.members = members
        self.index_path = index_path
        self.joiner = joiner
        self.subflavors = subflavors
        self.root = members[0].root
        self.split_part = members[0].split_part
        self.builders = [load_sample_builder(m.root, m.dataset_config) for m in members]
        self.builder = _JoinBuilder(getattr(joiner, "__name__", None), subflavors, joiner)
        self.excluded: frozenset[int] = frozenset()
        rows = self._rows()
        primary_shards = rows[:, 0]
        self.count = len(rows)
        changes = (
            np.flatnonzero(np.diff(primary_shards)) + 1
            if len(rows)
            else np.array([], dtype=np.int64)
        )
        self.shard_starts = [0, *[int(c) for c in changes]]
        self._mapped: np.ndarray | None = None

    def _rows(self) -> np.ndarray:
        if not os.path.exists(self.index_path):
            raise FileNotFoundError(
                f"join index {self.index_path} not found (or out of date): run `energon prepare "
                "<metadataset.yaml>` to build it"
            )
        with open(self.index_path, "rb") as f:
            if f.read(8) != MAGIC:
                raise MetadatasetError(f"{self.index_path}: not a JIDX0001 join index")
            (columns,) = struct.unpack("<q", f.read(8))
        if columns != len(self.members):
            raise MetadatasetError(
                f"{self.index_path}: has {columns} columns, the join has {len(self.members)}"
            )
        data = np.memmap(self.index_path, dtype="<i8", mode="r", offset=16)
        return (
            data.reshape(-1, columns, 3)[:, 0, :] if len(data) else np.zeros((0, 3), dtype=np.int64)
        )

    def _table(self) -> np.ndarray:
        if self._mapped is None:
            data = np.memmap(self.index_path, dtype="<i8", mode="r", offset=16)
            self._mapped = data.reshape(-1, len(self.members), 3)
        return self._mapped

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": None}

    def __len__(self) -> int:
        return self.count

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        from energon.samples import SourceInfo
        from energon.source.shard_reader import shard_reader

        row = self._table()[index].tolist()
        samples = []
        for member, builder, (shard, offset, size) in zip(self.members, self.builders, row):
            if shard < 0:
                samples.append(None)
                continue
            path = os.path.join(member.root, member.shards[shard])
            data = shard_reader().read(path, offset, offset + size)
            members = split_sample_bytes(data, base_offset=offset, path=path)
            key, parts = _decode(members, builder, decoder, path, offset, member.root)
            base = {
                "__key__": key,
                "__restore_key__": restore_key,
                "__subflavors__": {**builder.subflavors, **self.subflavors},
                "__sources__": (
                    SourceInfo(
                        dataset_path=member.root,
                        index=index,
                        shard_name=member.shards[shard],
                        file_names=tuple(n for n, _ in members),
                    ),
                ),
            }
            samples.append(builder.build(parts, base, member.shards[shard]))
        return self._join(samples, restore_key)

    def _join(self, samples: list[Any], restore_key: tuple) -> Any:
        joiner = self.joiner
        names = [m.name for m in self.members]
        if joiner is None:
            joined = type(samples[0]).from_joined(*samples)
        elif isinstance(joiner, type) and hasattr(joiner, "from_joined"):
            joined = (
                joiner.from_joined(**dict(zip(names, samples)))
                if names[0] is not None
                else joiner.from_joined(*samples)
            )
        elif names[0] is not None:
            joined = joiner(**dict(zip(names, samples)))
        else:
            joined = joiner(*samples)
        if hasattr(joined, "__restore_key__"):
            joined.__restore_key__ = restore_key
        return joined

    def fingerprint(self) -> dict[str, Any]:
        return {
            "path": self.root,
            "split_part": self.split_part,
            "join": [[m.root, m.split_part, m.nonmatch] for m in self.members],
            "join_index": os.path.basename(self.index_path),
            "shards": [[self.root, self.count]],
        }

    def config(self) -> dict[str, Any]:
        return {**self.fingerprint(), "joiner": self.builder.joiner_name}


@dataclasses.dataclass
class _JoinBuilder:
    joiner_name: str | None
    subflavors: dict[str, Any]
    joiner: Any = None

    @property
    def sample_type(self) -> Any:
        return self.joiner if isinstance(self.joiner, type) else None


def _decode(
    members, builder, decoder, path: str, offset: int, root: str
) -> tuple[str, dict[str, Any]]:
    from energon.format.tar import split_member_name

    key = None
    parts: dict[str, Any] = {}
    for name, payload in members:
        split = split_member_name(name)
        if split is None:
            continue
        key = key or split[0]
        if builder.wants_part(split[1]):
            raw = bytes(payload)
            try:
                parts[split[1]] = (
                    decoder.decode_part(
                        split[1],
                        raw,
                        key=key,
                        dataset=root,
                        dataset_allows_pickle=builder.allow_pickle,
                    )
                    if decoder is not None
                    else raw
                )
            except Exception as e:
                raise SampleException(f"{path} sample {key!r} at byte offset {offset}: {e}") from e
    if key is None:
        raise SampleException(f"{path} at byte offset {offset}: no sample members")
    return key, parts


def resolve_join(node: Join, ctx: Any) -> Any:
    """A :class:`~energon.metadataset.resolve.Source` over the prepared join index of ``node``."""
    from energon.format.typeref import resolve_class
    from energon.metadataset.resolve import Source, _apply_subsets, _combine_shuffle

    split_part = node.split_part or ctx.split_part
    members = [_resolve_member(m, ctx.base_dir, split_part) for m in node.members]
    mds_path = getattr(ctx, "mds_path", None)
    if not mds_path:
        raise MetadatasetError("joins are only supported inside a metadataset YAML file")
    index_path = os.path.join(cache_dir(mds_path), join_index_name(members))
    joiner = None
    if node.joiner is not None:
        name = node.joiner.get("__class__") or node.joiner.get("__function__")
        joiner = resolve_class(node.joiner.get("__module__", "energon"), name, where=mds_path)
    subflavors = {**node.subflavors, **ctx.subflavors}
    leaf = JoinLeaf(members, index_path, joiner, subflavors)
    start, end = _apply_subsets(0, len(leaf), node.subset, ctx.ratios)
    return Source(
        leaf=leaf,
        start=start,
        end=end,
        weight=ctx.weight,
        repetitions=ctx.repetitions,
        shuffle_over_epochs=_combine_shuffle(ctx.shuffle, node.shuffle_over_epochs_multiplier),
    )
