"""``megatron.energon.flavors.webdataset.structs``: the records that describe a prepared
WebDataset (``.info.json``, the split config, shards, a subset, a raw sample)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

from energon.compat.epathlib import EPath
from energon.samples.edataclass import edataclass
from energon.samples.source_info import SourceInfo

__all__ = [
    "DatasetSubset",
    "EPath",
    "FilteredSample",
    "ShardInfo",
    "SourceInfo",
    "WebdatasetInfo",
    "WebdatasetSplits",
    "edataclass",
]


@edataclass
class WebdatasetInfo:
    """``.nv-meta/.info.json``: the samples of every shard."""

    energon_version: str | None = None
    shard_counts: dict[str, int]


@edataclass
class WebdatasetSplits:
    """The split config (``split.yaml``): the shards of every split and excluded shards/samples."""

    split_parts: dict[str, list[str]]
    exclude: list[str] = dataclasses.field(default_factory=list)


@edataclass
class ShardInfo:
    """One shard of a split: its name (relative to the dataset), path and sample count."""

    name: str
    path: EPath
    count: int


class FilteredSample(TypedDict):
    """A raw sample as the loaders read it: its key, shard, restore key, sources and parts."""

    __key__: str
    __shard__: str
    __restore_key__: tuple[str, int]
    __sources__: tuple[SourceInfo, ...]


@edataclass
class DatasetSubset:
    """A window of a split: ``absolute_range=(start, end)`` samples (end None: to the end),
    then ``range=(from, to)`` as fractions of what is left."""

    range: tuple[float, float] | None = None  # noqa: A003 - the reference's name
    absolute_range: tuple[int, int | None] | None = None

    def compute_subset(self, total_samples: int) -> tuple[int, int]:
        start, end = 0, total_samples
        if self.absolute_range is not None:
            a, b = self.absolute_range
            start, end = max(0, a), total_samples if b is None else min(total_samples, b)
        if self.range is not None:
            lo, hi = self.range
            length = end - start
            start, end = start + int(lo * length), start + int(hi * length)
        return start, end

    def config(self) -> dict[str, Any]:
        return {"range": self.range, "absolute_range": self.absolute_range}
