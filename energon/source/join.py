"""The join leaf: rows of a prepared join index, each the samples of several datasets with the same
key, combined by a joiner.

Loading row ``i`` reads every member's sample directly and builds it with that member's
``dataset.yaml``, then calls the joiner. A WebDataset member's sample is one pread at the byte
range the index stores; a Parquet member's is a row (file, row) that its own
:class:`~energon.source.parquet.ParquetLeaf` reads by row group. The index itself (its layout,
building it, its file name) is :mod:`energon.format.join_index`'s.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from energon.errors import SampleException
from energon.format.join_index import JoinMemberSplit, read_join_rows
from energon.format.shard_table import listed_shards_fingerprint
from energon.format.tar import split_member_name, split_sample_bytes
from energon.samples import SourceInfo
from energon.source.dataset_config import load_sample_builder
from energon.source.parquet import ParquetLeaf
from energon.source.shard_reader import shard_reader
from energon.source.webdataset import tar_byte_index


@dataclasses.dataclass(frozen=True)
class JoinSpec:
    """What a join leaf is opened from: its members' splits, its index file and its joiner (a
    sample class with ``from_joined``, a function, or None for the primary's sample type)."""

    members: tuple[JoinMemberSplit, ...]
    index_path: str
    joiner: Any = None


class TarMember:
    """A WebDataset member: a sample is the tar bytes at ``(shard, offset, size)``."""

    kind = "webdataset"

    def __init__(self, member: JoinMemberSplit, subflavors: dict[str, Any]) -> None:
        self.member = member
        self.builder = load_sample_builder(member.root, member.dataset_config)
        self.subflavors = {**self.builder.subflavors, **subflavors}

    def load(self, row: tuple[int, int, int], index: int, decoder: Any, restore_key: tuple) -> Any:
        """The member's sample of join row ``index``."""
        shard, offset, size = row
        member, builder = self.member, self.builder
        path = os.path.join(member.root, member.shards[shard])
        data = shard_reader().read(path, offset, offset + size, tar_byte_index)
        members = split_sample_bytes(data, base_offset=offset, path=path)
        key, parts = _decode(members, builder, decoder, path, offset, member.root)
        base = {
            "__key__": key,
            "__restore_key__": restore_key,
            "__subflavors__": dict(self.subflavors),
            "__sources__": (
                SourceInfo(
                    dataset_path=member.root,
                    index=index,
                    shard_name=member.shards[shard],
                    file_names=tuple(n for n, _ in members),
                ),
            ),
        }
        return builder.build(parts, base, member.shards[shard])


class ParquetMember:
    """A Parquet/Arrow member: a sample is row ``row`` of file ``file`` (the triple's third
    number, the row group, is for people reading the index), read by the member's own leaf."""

    kind = "parquet"

    def __init__(self, member: JoinMemberSplit, subflavors: dict[str, Any]) -> None:
        self.member = member
        self.leaf = ParquetLeaf.open(
            member.root,
            split_part=member.split_part,
            split_config=member.split_config,
            dataset_config=member.dataset_config,
            subflavors=subflavors,
        )
        self.builder = self.leaf.builder
        self._files = {name: i for i, name in enumerate(self.leaf.shard_names)}

    def leaf_index(self, row: tuple[int, int, int]) -> int:
        """The member leaf's index of the row a join-index triple names."""
        file, in_file, _ = row
        return self.leaf.shard_starts[self._files[self.member.shards[file]]] + in_file

    def load(self, row: tuple[int, int, int], index: int, decoder: Any, restore_key: tuple) -> Any:
        return self.leaf.load(self.leaf_index(row), decoder, restore_key)


def join_member(member: JoinMemberSplit, subflavors: dict[str, Any]) -> TarMember | ParquetMember:
    """The reader of one join member, by its kind."""
    return (
        ParquetMember(member, subflavors)
        if member.kind == "parquet"
        else TarMember(member, subflavors)
    )


class JoinLeaf:
    """Rows of a join index as one leaf: loading row ``i`` reads every member's sample directly
    (a tar byte range, or a Parquet row), builds each member's sample and calls the joiner."""

    kind = "join"
    remote = False  # joins are built and read on local files

    def __init__(self, spec: JoinSpec, subflavors: dict[str, Any]) -> None:
        self.members = list(spec.members)
        self.index_path = spec.index_path
        self.joiner = spec.joiner
        self.subflavors = subflavors
        self.root = self.members[0].root
        self.split_part = self.members[0].split_part
        self.readers = [join_member(m, subflavors) for m in self.members]
        self.builder = _JoinBuilder(getattr(self.joiner, "__name__", None), subflavors, self.joiner)
        self.excluded: frozenset[int] = frozenset()
        primary_shards = read_join_rows(self.index_path, len(self.members))[:, 0, 0]
        self.count = len(primary_shards)
        changes = (
            np.flatnonzero(np.diff(primary_shards)) + 1
            if self.count
            else np.array([], dtype=np.int64)
        )
        self._shard_starts = [0, *[int(c) for c in changes]]
        self._mapped: np.ndarray | None = None

    def _table(self) -> np.ndarray:
        if self._mapped is None:
            self._mapped = read_join_rows(self.index_path, len(self.members))
        return self._mapped

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mapped": None}

    def __len__(self) -> int:
        return self.count

    @property
    def shard_starts(self) -> list[int]:
        return self._shard_starts

    def prefetch(self, first: int, end: int, later: bool = False) -> None:
        """Local files only: nothing to hint."""

    def load(self, index: int, decoder: Any, restore_key: tuple) -> Any:
        samples = [
            None if row[0] < 0 else reader.load(tuple(row), index, decoder, restore_key)
            for reader, row in zip(self.readers, self._table()[index].tolist())
        ]
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
            "shards": listed_shards_fingerprint([self.root], [self.count]),
        }

    def config(self) -> dict[str, Any]:
        return {**self.fingerprint(), "joiner": self.builder.joiner_name}


@dataclasses.dataclass
class _JoinBuilder:
    joiner_name: str | None
    subflavors: dict[str, Any]
    joiner: Any = None
    kind: str = "joined"

    @property
    def sample_type(self) -> Any:
        return self.joiner if isinstance(self.joiner, type) else None


def _decode(
    members, builder, decoder, path: str, offset: int, root: str
) -> tuple[str, dict[str, Any]]:
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
