"""``WorkerConfig`` and the mapping of the global micro-batch sequence onto ranks and workers.

The data order is defined over ``num_streams`` logical streams: global micro-batch ``m`` is batch
``m // L`` of stream ``m % L``. Rank ``r`` of ``R`` consumes ``base + r, base + r + R, ...``; its
physical worker ``w`` of ``W`` produces every ``W``-th of those, which is exactly the order in which
torch's DataLoader collects results from its workers. Nothing here depends on how many ranks or
workers there are, except who computes what.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TextIO

from energon import debug_log
from energon.errors import ErrorHandler, log_exception, reraise_exception


@dataclasses.dataclass(kw_only=True, eq=False)
class WorkerConfig:
    """Who this process is in the data-parallel job and how many loader workers it runs.

    ``rank``/``world_size`` are the *data-parallel* rank and size. ``num_workers=0`` loads in the
    main process. ``seed_offset`` changes the data order; nothing else random does.
    ``worker_debug_path`` / ``worker_log_level`` write per-process debug logs (see
    :mod:`energon.debug_log`; ``energon analyze-debug`` renders them); ``_worker_debug_file`` (an
    open text file) receives the log lines of the process whose log file number is
    ``_worker_debug_file_worker_id`` instead of a file under ``worker_debug_path`` (Megatron-Energon
    accepts both fields too). ``global_error_handler`` sees every skipped sample;
    ``restore_error_handler`` handles errors while ``loader.restore_sample`` regenerates an item.
    Every field is used; the signature is Megatron-Energon's.
    """

    rank: int
    world_size: int
    num_workers: int
    data_parallel_group: Any = None
    seed_offset: int = 0
    worker_debug_path: str | None = None
    worker_log_level: int = 0
    _worker_debug_file: TextIO | None = dataclasses.field(default=None, repr=False)
    _worker_debug_file_worker_id: int | None = None
    global_error_handler: ErrorHandler = log_exception
    restore_error_handler: ErrorHandler = reraise_exception

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in [0, world_size): rank={self.rank}, world_size={self.world_size}"
            )
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")

    @staticmethod
    def default_worker_config(
        num_workers: int = 4, data_parallel_group: Any = None
    ) -> WorkerConfig:
        """Rank and world size from ``torch.distributed`` when it is initialised, else a single rank."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank(data_parallel_group)
            world_size = dist.get_world_size(data_parallel_group)
        else:
            rank, world_size = 0, 1
        return WorkerConfig(
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            data_parallel_group=data_parallel_group,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerConfig):
            return NotImplemented
        return (self.rank, self.world_size, self.num_workers) == (
            other.rank,
            other.world_size,
            other.num_workers,
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def default_num_streams(self) -> int:
        """``world_size * max(1, num_workers)``: reproduces the reference's per-worker order."""
        return self.world_size * max(1, self.num_workers)

    def global_worker_id(self, local_worker_id: int = 0) -> int:
        return self.rank * max(1, self.num_workers) + local_worker_id

    def should_log(self, level: int) -> bool:
        """True when this config's debug log records events of ``level``."""
        return debug_log.should_log(self, level)

    def worker_log(self, data: dict[str, Any]) -> None:
        """Write one record to this process's debug log file (or stdout without a path)."""
        debug_log.write(self, data)

    def config(self) -> dict[str, Any]:
        group_size = None
        if self.data_parallel_group is not None:
            try:
                import torch.distributed as dist

                group_size = dist.get_world_size(self.data_parallel_group)
            except Exception:
                group_size = None
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "data_parallel_group": group_size,
        }


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which global micro-batch positions one executor (a rank's worker) produces, in order."""

    num_streams: int
    world_size: int
    rank: int
    num_workers: int = 1
    worker: int = 0
    base: int = 0

    def position(self, k: int) -> int:
        """Global position of this executor's ``k``-th micro-batch."""
        rank_index = self.worker + k * max(1, self.num_workers)
        return self.base + self.rank + rank_index * self.world_size

    def positions(self, end: int | None = None) -> Iterator[int]:
        """This executor's positions in increasing order, below ``end`` if given."""
        k = 0
        while True:
            m = self.position(k)
            if end is not None and m >= end:
                return
            yield m
            k += 1

    def streams(self) -> list[int]:
        """The logical streams this executor reads from (its positions cycle through them)."""
        return sorted({self.position(k) % self.num_streams for k in range(self.num_streams)})
