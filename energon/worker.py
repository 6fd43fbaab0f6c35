"""``WorkerConfig`` and the mapping of the global micro-batch sequence onto ranks and workers.

The data order is defined over ``num_streams`` logical streams: global micro-batch ``m`` is batch
``m // L`` of stream ``m % L``. Rank ``r`` of ``R`` consumes ``base + r, base + r + R, ...``; its
physical worker ``w`` of ``W`` produces every ``W``-th of those, which is exactly the order in which
torch's DataLoader collects results from its workers. Nothing here depends on how many ranks or
workers there are, except who computes what.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar, TextIO

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

    def global_worker_id(self, override_local_worker_id: int | None = None) -> int:
        """``rank * num_workers + local worker id`` (the current worker's unless overridden)."""
        local = (
            self.rank_worker_id() if override_local_worker_id is None else override_local_worker_id
        )
        return self.rank * max(1, self.num_workers) + local

    # -- Megatron-Energon's worker context ---------------------------------------------------
    # For code that drives dataset pieces by hand, as the reference's own datasets do: the config
    # of the worker that is iterating, and the index of the sample being made. energon's loaders
    # keep this per logical stream themselves and never read it.

    active_worker_config: ClassVar[WorkerConfig | None] = None
    worker_id_offset: ClassVar[int] = 0
    # the local worker a hand-written dataset's stream is computed for (energon.loader.hand_written):
    # a logical stream is one of the reference's workers, whichever process computes it
    acting_worker: ClassVar[int | None] = None

    def worker_activate(
        self, sample_index: int, override_global_rank: int | None = None, cache_pool: Any = None
    ) -> None:
        """Make this the active config of the current worker, at ``sample_index``."""
        WorkerConfig.active_worker_config = self
        self.__dict__["_sample_indexes"] = [sample_index]
        self.__dict__["_override_global_rank"] = override_global_rank
        self.__dict__["_cache_pool"] = cache_pool

    def worker_deactivate(self) -> None:
        if WorkerConfig.active_worker_config is self:
            WorkerConfig.active_worker_config = None
        self.__dict__["_sample_indexes"] = []

    def worker_push_sample_index(self, sample_index: int) -> None:
        self.__dict__.setdefault("_sample_indexes", []).append(sample_index)

    def worker_pop_sample_index(self) -> int:
        return self.__dict__.setdefault("_sample_indexes", []).pop()

    @property
    def active_worker_sample_index(self) -> int:
        """The index of the sample the active worker is making."""
        indexes = self.__dict__.get("_sample_indexes") or []
        if not indexes:
            raise RuntimeError("no active worker: call worker_activate(sample_index) first")
        return indexes[-1]

    @property
    def active_worker_batch_index(self) -> int:
        """The batch index of the active worker (its outermost sample index)."""
        indexes = self.__dict__.get("_sample_indexes") or []
        if not indexes:
            raise RuntimeError("no active worker: call worker_activate(sample_index) first")
        return indexes[0]

    def assert_worker(self) -> None:
        """Raise unless this process is a loader worker when the config has workers."""
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        if self.num_workers > 0 and info is None:
            raise AssertionError("Cannot iterate out of worker context")
        if info is not None and info.num_workers != self.num_workers:
            raise AssertionError(
                f"the loader runs {info.num_workers} workers, the worker config says {self.num_workers}"
            )

    def rank_worker_id(self) -> int:
        """This process's worker id within the rank (0 in the main process), or the worker whose
        logical stream this process is computing for a hand-written dataset."""
        if WorkerConfig.acting_worker is not None:
            return WorkerConfig.acting_worker
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        return 0 if info is None else info.id

    def global_rank(self) -> int:
        """The global rank (``torch.distributed``), not the rank within the data-parallel group."""
        override = self.__dict__.get("_override_global_rank")
        if override is not None:
            return override
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else self.rank

    def worker_seed(self, override_local_worker_id: int | None = None) -> int:
        """A seed for the current (or the given) worker from ``seed_offset`` and its global id."""
        from energon.plan.rng import stable_seed

        worker = self.global_worker_id(override_local_worker_id)
        return stable_seed(self.seed_offset, "worker-seed", worker) & 0xFFFFFFFF

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
        """The logical streams this executor reads from (its positions cycle through them).

        Position ``k`` is ``position(0) + k * stride`` (stride: workers x world size), so modulo
        the stream count the positions run through ``position(0)`` plus the multiples of
        ``gcd(stride, streams)``: one step per stream read, not per stream of the world (a
        worker of rank 4,095 of 4,096 starts sooner)."""
        stride = max(1, self.num_workers) * self.world_size
        step = math.gcd(stride, self.num_streams)
        first = self.position(0)
        return sorted(
            (first + j * step) % self.num_streams for j in range(self.num_streams // step)
        )
