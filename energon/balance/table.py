"""Sample costs looked up fast: one SQLite query per shard instead of several per sample.

The balanced executor costs every sample of every global step on every rank, so per-sample point
queries would cost more than the balancing is worth. For WebDatasets the table reads a whole
shard's part sizes, keys and media metadata at once, hands the cost function ready-filled
:class:`~energon.source.meta.SampleMeta` objects, and keeps the costs of the last shards it read
(a stream reads slices of a shard one after the other). Other leaves are costed sample by sample
through their :class:`~energon.source.meta.MetaReader`. :meth:`CostTable.planned_costs` looks up
what the plan counts of a whole window's samples at once, a shard at a time with numpy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from energon.balance.cost import (
    MISSING_FIELD_ERRORS,
    CostFunction,
    SampleCost,
    cost_failure,
    cost_name,
    dataset_name,
)
from energon.format.media_metadata import deserialize_media_metadata
from energon.source.meta import SampleMeta, WebdatasetMeta, has_table, meta_reader

CACHED_SHARDS = 64


class CostTable:
    """``cost(source, index)`` of the samples of a pipeline's sources."""

    def __init__(
        self,
        leaves: Sequence[Any],
        cost: CostFunction,
        planned: Callable[[SampleCost], float] | None = None,
    ) -> None:
        """``planned``: what the plan counts of a sample of a given cost (e.g.
        :meth:`~energon.balance.Balance.planned_cost`; default: its cost), for
        :meth:`planned_costs`."""
        self.leaves = list(leaves)
        self.cost_fn = cost
        self.planned = planned or _cost_of
        self._readers: dict[int, Any] = {}
        self._shards: OrderedDict[tuple[int, int], tuple[int, list[SampleCost]]] = OrderedDict()
        self._planned: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def reader(self, source: int) -> Any:
        reader = self._readers.get(source)
        if reader is None:
            reader = self._readers[source] = meta_reader(self.leaves[source])
        return reader

    def cost(self, source: int, index: int) -> SampleCost:
        reader = self.reader(source)
        if not isinstance(reader, WebdatasetMeta):
            return self._cost_of(SampleMeta(reader, source, index))
        shard, inner = reader.locate(index)
        entry = self._shards.get((source, shard))
        if entry is None:
            entry = self._load_shard(reader, source, shard, index - inner)
        else:
            self._shards.move_to_end((source, shard))
        return entry[1][inner]

    def planned_costs(self, sources: Sequence[int], indices: Sequence[int]) -> list[float]:
        """``planned(cost(source, index))`` of each pair: the same values as one by one, looked up
        a shard at a time with numpy (the executor costs every pointer of every rank's window, so
        per-sample Python would cost microseconds per pointer)."""
        out = np.empty(len(indices), dtype=np.float64)
        all_sources = np.asarray(sources, dtype=np.int64)
        all_indices = np.asarray(indices, dtype=np.int64)
        for source in np.unique(all_sources).tolist():
            where = np.flatnonzero(all_sources == source)
            out[where] = self._planned_of_source(source, all_indices[where])
        return out.tolist()

    def _planned_of_source(self, source: int, indices: np.ndarray) -> np.ndarray:
        reader = self.reader(source)
        if not isinstance(reader, WebdatasetMeta):
            return np.array(
                [self.planned(self.cost(source, i)) for i in indices.tolist()], dtype=np.float64
            )
        starts = np.asarray(reader.leaf.shard_starts, dtype=np.int64)
        size = len(reader.leaf)
        if len(indices) and (indices.min() < 0 or indices.max() >= size):
            bad = int(indices[(indices < 0) | (indices >= size)][0])
            raise IndexError(f"sample index {bad} out of range [0, {size}) in {reader.leaf.root}")
        shards = np.searchsorted(starts, indices, side="right") - 1
        out = np.empty(len(indices), dtype=np.float64)
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            first = int(starts[shard])
            out[where] = self._planned_shard(reader, source, shard, first)[indices[where] - first]
        return out

    def _planned_shard(
        self, reader: WebdatasetMeta, source: int, shard: int, first: int
    ) -> np.ndarray:
        """What the plan counts of every sample of one shard (kept for the last shards read)."""
        planned = self._planned.get((source, shard))
        if planned is not None:
            self._planned.move_to_end((source, shard))
            return planned
        entry = self._shards.get((source, shard))
        if entry is None:
            entry = self._load_shard(reader, source, shard, first)
        planned = np.array([self.planned(cost) for cost in entry[1]], dtype=np.float64)
        self._planned[(source, shard)] = planned
        while len(self._planned) > CACHED_SHARDS:
            self._planned.popitem(last=False)
        return planned

    def _load_shard(
        self, reader: WebdatasetMeta, source: int, shard: int, first: int
    ) -> tuple[int, list[SampleCost]]:
        db = reader._connection()
        tar_id, _ = reader._where(first)
        keys = dict(
            db.execute(
                "SELECT sample_index, sample_key FROM samples WHERE tar_file_id=?", (tar_id,)
            )
        )
        parts: dict[int, dict[str, int]] = {i: {} for i in keys}
        for inner, name, size in db.execute(
            "SELECT sample_index, part_name, content_byte_size FROM sample_parts "
            "WHERE tar_file_id=?",
            (tar_id,),
        ):
            parts.setdefault(inner, {})[name] = int(size)
        media: dict[str, Any] = {}
        if has_table(db, "media_metadata"):
            for entry_key, kind, text in db.execute(
                "SELECT m.entry_key, m.metadata_type, m.metadata_json FROM samples s "
                "JOIN media_metadata m ON m.entry_key >= s.sample_key || '.' "
                "AND m.entry_key < s.sample_key || '/' WHERE s.tar_file_id=?",
                (tar_id,),
            ):
                media[entry_key] = deserialize_media_metadata(kind, text)
        costs = []
        for inner in range(len(keys)):
            meta = SampleMeta(reader, source, first + inner)
            key = keys.get(inner)
            sample_parts = parts.get(inner, {})
            meta._cache["key"] = key
            meta._cache["parts"] = sample_parts
            meta._cache["media"] = {
                part: media[f"{key}.{part}"] for part in sample_parts if f"{key}.{part}" in media
            }
            costs.append(self._cost_of(meta))
        entry = (first, costs)
        self._shards[(source, shard)] = entry
        while len(self._shards) > CACHED_SHARDS:
            self._shards.popitem(last=False)
        return entry

    def _cost_of(self, meta: SampleMeta) -> SampleCost:
        """The cost function's value for one sample; a sample lacking what it reads is a
        :class:`~energon.balance.cost.BalanceCostError` naming the field, key and dataset."""
        try:
            value = self.cost_fn(meta)
        except MISSING_FIELD_ERRORS as e:
            leaf = self.leaves[meta.source]
            raise cost_failure(
                e, f"the cost function {cost_name(self.cost_fn)}", meta.key, dataset_name(leaf)
            ) from e
        return _checked(value, meta.source, meta.index)


def _cost_of(cost: SampleCost) -> float:
    return cost.cost


def _checked(value: Any, source: int, index: int) -> SampleCost:
    try:
        tokens, cost = value
        return SampleCost(int(tokens), float(cost))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"the balance cost function returned {value!r} for sample {index} of source {source}: "
            "it must return SampleCost(tokens, cost)"
        ) from e
