"""``megatron.energon.flavors.webdataset.sharder``: how a split's samples are cut into slices for
the workers of all ranks. The arithmetic is energon's plan (:mod:`energon.plan.sharding`), which
follows the reference's algorithm: worker ``w`` of rank ``r`` is logical stream
``r * num_workers + w`` of ``world_size * num_workers``."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from energon.compat.webdataset.structs import DatasetSubset, ShardInfo
from energon.plan.sharding import slice_bounds, stream_counts
from energon.worker import WorkerConfig

__all__ = ["DatasetSubset", "ShardInfo", "Sharder", "WorkerConfig"]


def _rank_streams(worker_config: WorkerConfig) -> tuple[int, range]:
    workers = max(1, worker_config.num_workers)
    first = worker_config.rank * workers
    return worker_config.world_size * workers, range(first, first + workers)


class Sharder:
    """Slices of the global sample range for the workers of this rank."""

    @classmethod
    def split_samples_to_workers(
        cls,
        start_samples: int,
        end_samples: int,
        worker_config: WorkerConfig,
        *,
        rotation_offset: int = 0,
    ) -> list[int]:
        """Boundaries of the ranges of this rank's workers inside ``[start, end)``:
        ``[first start, ..., last end]``."""
        num_streams, mine = _rank_streams(worker_config)
        counts = stream_counts(end_samples - start_samples, num_streams, rotation_offset)
        starts = [start_samples, *(start_samples + c for c in accumulate(counts))]
        return starts[mine.start : mine.stop + 1]

    @classmethod
    def _slices(
        cls,
        total_samples: int,
        shard_starts: Sequence[int],
        worker_config: WorkerConfig,
        max_samples_per_sequence: int | None,
        subset: DatasetSubset | None,
        rotation_offset: int,
    ) -> tuple[tuple[int, ...], ...]:
        start, end = (subset or DatasetSubset()).compute_subset(total_samples)
        bounds = cls.split_samples_to_workers(
            start, end, worker_config, rotation_offset=rotation_offset
        )
        return tuple(
            tuple(int(x) for x in slice_bounds(a, b, shard_starts, max_samples_per_sequence))
            if b > a
            else (a, b)
            for a, b in zip(bounds, bounds[1:])
        )

    @classmethod
    def slice_workers(
        cls,
        total_samples: int,
        worker_config: WorkerConfig,
        *,
        max_samples_per_sequence: int | None,
        subset: DatasetSubset | None = None,
        rotation_offset: int = 0,
    ) -> tuple[tuple[int, ...], ...]:
        """Per worker of this rank, the slice boundaries of its range (slices of about
        ``max_samples_per_sequence`` samples)."""
        return cls._slices(
            total_samples, [0], worker_config, max_samples_per_sequence, subset, rotation_offset
        )

    @classmethod
    def shard_workers(
        cls,
        shards: list[ShardInfo],
        worker_config: WorkerConfig,
        *,
        max_samples_per_sequence: int | None,
        subset: DatasetSubset | None = None,
        rotation_offset: int = 0,
    ) -> tuple[tuple[int, ...], ...]:
        """As :meth:`slice_workers`, with slices also cut at shard boundaries."""
        counts = [shard.count for shard in shards]
        starts = [0, *accumulate(counts)][:-1]
        return cls._slices(
            sum(counts), starts, worker_config, max_samples_per_sequence, subset, rotation_offset
        )
