"""Sample costs looked up fast: one SQLite query per shard instead of several per sample.

The balanced executor costs every sample of every global step on every rank, so per-sample point
queries would cost more than the balancing is worth. For WebDatasets the table reads a whole
shard's part sizes, keys and media metadata at once, hands the cost function ready-filled
:class:`~energon.source.meta.SampleMeta` objects, and keeps the costs of the last shards it read
(a stream reads slices of a shard one after the other). Other leaves are costed sample by sample
through their :class:`~energon.source.meta.MetaReader`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from energon.balance.cost import CostFunction, SampleCost
from energon.media.metadata import deserialize_media_metadata
from energon.source.meta import SampleMeta, WebdatasetMeta, has_table, meta_reader

CACHED_SHARDS = 64


class CostTable:
    """``cost(source, index)`` of the samples of a pipeline's sources."""

    def __init__(self, leaves: Sequence[Any], cost: CostFunction) -> None:
        self.leaves = list(leaves)
        self.cost_fn = cost
        self._readers: dict[int, Any] = {}
        self._shards: OrderedDict[tuple[int, int], tuple[int, list[SampleCost]]] = OrderedDict()

    def reader(self, source: int) -> Any:
        reader = self._readers.get(source)
        if reader is None:
            reader = self._readers[source] = meta_reader(self.leaves[source])
        return reader

    def cost(self, source: int, index: int) -> SampleCost:
        reader = self.reader(source)
        if not isinstance(reader, WebdatasetMeta):
            return _checked(self.cost_fn(SampleMeta(reader, source, index)), source, index)
        shard, inner = reader.locate(index)
        entry = self._shards.get((source, shard))
        if entry is None:
            entry = self._load_shard(reader, source, shard, index - inner)
        else:
            self._shards.move_to_end((source, shard))
        return entry[1][inner]

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
            costs.append(_checked(self.cost_fn(meta), source, first + inner))
        entry = (first, costs)
        self._shards[(source, shard)] = entry
        while len(self._shards) > CACHED_SHARDS:
            self._shards.popitem(last=False)
        return entry


def _checked(value: Any, source: int, index: int) -> SampleCost:
    try:
        tokens, cost = value
        return SampleCost(int(tokens), float(cost))
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"the balance cost function returned {value!r} for sample {index} of source {source}: "
            "it must return SampleCost(tokens, cost)"
        ) from e
