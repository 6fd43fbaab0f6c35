"""How a loader's items reach it: in its own process (no workers), from local worker processes, or
from the workers of a pool factory (Ray actors).

:class:`WorkerTransport` opens a *source* at the loader's consumed position: an iterator of
``(value, meta)`` in plan order (:class:`~energon.loader.workers.results.WorkerResults` over the
workers). Closing it drops what the workers computed ahead; opening again resumes exactly where the
loader stands, which is also how a blend weight change reaches every worker (:meth:`restart_from`).
A worker pool made by a factory is kept from pass to pass until :meth:`shutdown`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch

from energon.errors import WatchdogTimeout, WorkerRecoveryError
from energon.loader.position import LoaderPosition
from energon.loader.recovery import Recovery
from energon.loader.savable_dataset import SavableDataset
from energon.loader.workers.base import WorkerPoolFactory
from energon.loader.workers.messages import collate
from energon.loader.workers.processes import ProcessPool
from energon.loader.workers.results import Watch, WorkerResults
from energon.memory.batch_arena import BatchArena, arena_supported
from energon.observe.stall import StallCheck
from energon.observe.stats import LoaderMonitor
from energon.pipeline.executor import ItemMeta
from energon.pipeline.stage import Value
from energon.task_encoder.base import hook_context


class WorkerTransport:
    """Opens, reads and closes the source of one loader. ``factory``: who runs the workers (None:
    local processes, as many as the dataset's worker config says)."""

    def __init__(
        self,
        monitor: LoaderMonitor,
        recovery: Recovery,
        *,
        prefetch_factor: int,
        cache_pool: Any,
    ) -> None:
        self._monitor = monitor
        self._recovery = recovery
        self.prefetch_factor = prefetch_factor
        self.cache_pool = cache_pool
        self.factory: WorkerPoolFactory | None = None
        self.restart_at: int | None = None  # reopen the source here (blend weights changed)
        self._restart_dataset: SavableDataset | None = None  # with this dataset
        self._source: Iterator[tuple[Value, ItemMeta]] | None = None
        self._ended = False
        self._results: WorkerResults | None = None
        self._arena: BatchArena | None = None
        self._pool: Any = None  # the factory's pool, kept from pass to pass
        self._local_num_workers: int | None = None  # the worker config's, before any factory

    @property
    def is_open(self) -> bool:
        return self._source is not None

    @property
    def source(self) -> Iterator[tuple[Value, ItemMeta]] | None:
        """The open source (the worker results with workers), for tools that look at workers."""
        return self._source

    def use_factory(
        self, factory: WorkerPoolFactory | None, dataset: SavableDataset
    ) -> SavableDataset:
        """``loader.workers = factory``: from now on the factory's workers (None: local processes
        again) run ``dataset``, whose copy with that many workers per rank is returned."""
        if factory is not None and not isinstance(factory, WorkerPoolFactory):
            raise TypeError(
                f"workers must be None or a worker pool factory such as "
                f"RayWorkers(num_actors=...), got {factory!r}"
            )
        if self.is_open or self._monitor.board is not None:
            raise ValueError("set workers before iterating the loader")
        if self._local_num_workers is None:
            self._local_num_workers = dataset.worker_config.num_workers
        count = self._local_num_workers if factory is None else factory.num_workers
        self._monitor.num_workers = count
        self.factory = factory
        return dataset.with_num_workers(count)

    def open(self, dataset: SavableDataset, position: LoaderPosition) -> None:
        """Start reading ``dataset`` (its current spec) right after what ``position`` consumed."""
        wc = dataset.worker_config
        self.restart_at = self._restart_dataset = None  # the new source runs the current spec
        hook_context.cache_pool = self.cache_pool  # workers inherit it through fork
        self._ended = False
        resume = position.resume_point(wc.world_size, self._monitor.open_source())
        if wc.num_workers == 0:
            self._source = map(functools.partial(collate, None), dataset.executor(0, resume))
            return
        watch = self._watch(dataset, position)
        if self.factory is not None:
            self._pool = self.factory.pool(
                dataset,
                prefetch=self.prefetch_factor,
                pinned=torch.cuda.is_available(),
                board=self._monitor.board,
                cache_pool=self.cache_pool,
                previous=self._pool,
            )
            self._results = WorkerResults(self._pool, resume, self._recovery, watch)
        else:
            self._arena = BatchArena(wc.num_workers) if arena_supported() else None
            pool = ProcessPool(
                dataset,
                wc.num_workers,
                prefetch=self.prefetch_factor,
                arena=self._arena,
                pinned=torch.cuda.is_available(),
            )
            self._results = WorkerResults(pool, resume, self._recovery, watch, self._arena)
        self._source = self._results

    def _watch(self, dataset: SavableDataset, position: LoaderPosition) -> Watch:
        """What the worker results need to replace lost workers (energon.loader.recovery)."""
        wc, monitor, policy = dataset.worker_config, self._monitor, self._recovery.policy
        self._recovery.num_streams = dataset.spec.num_streams  # (a restore may change it)
        stall = None
        if policy.on_stall == "skip" and monitor.board is not None:
            stall = StallCheck(
                monitor.board, policy.stall_timeout_seconds, policy.stall_timeout_per
            )
        return Watch(
            rank=wc.rank,
            world_size=wc.world_size,
            board=monitor.board,
            stall=stall,
            report_stall=monitor.report_stall,
            stopped=monitor.stopped_by_watchdog,
            initial_snapshot=dataset.initial_snapshot,
            lost_sample=functools.partial(
                position.add_lost, initial_snapshot=dataset.initial_snapshot
            ),
        )

    def next_entry(self) -> tuple[Value, ItemMeta] | None:
        """The source's next ``(value, meta)``, or None once it has ended (and ever after, until
        it is closed). A watchdog timeout or a failed recovery closes it: the next opening
        restarts from the consumed position."""
        if self._ended:
            return None
        try:
            return self._monitor.next_entry(self._source)
        except StopIteration:
            self._ended = True
            return None
        except (WatchdogTimeout, WorkerRecoveryError):
            self.close()
            raise

    def received(self, value: Value, meta: ItemMeta) -> Value:
        """The value of an item as the loader hands it out (out of the batch arena if it came
        through it)."""
        return self._arena.import_(value) if meta.arena else value

    def restart_from(self, position: int, dataset: SavableDataset) -> None:
        """Reopen the source with ``dataset`` (a new spec) when the loader reaches global
        ``position``: an open source ran ahead under the old spec. Nothing to do while none is
        open (the next opening takes the loader's dataset)."""
        if self._source is not None and (self.restart_at is None or position < self.restart_at):
            self.restart_at = position
        self._restart_dataset = dataset

    def reopen_if_due(self, position: LoaderPosition) -> None:
        """Drop what the workers computed ahead and start them again from the consumed position,
        with the dataset of :meth:`restart_from`, once the loader has reached that point."""
        if self.restart_at is None or self._restart_dataset is None:
            return
        wc = self._restart_dataset.worker_config
        if position.next_position(wc.rank, wc.world_size) >= self.restart_at:
            self.close()
            self.open(self._restart_dataset, position)

    def close(self) -> None:
        """Drop the source and what its workers computed ahead (a factory's pool is kept)."""
        source, self._source = self._source, None
        self._ended = False
        if source is not None:
            self._monitor.close_source()
        results, self._results = self._results, None
        if results is not None:
            if self._arena is not None:
                self._arena.release_workers()
            results.close()
        if self._arena is not None:
            self._arena.close()

    def shutdown(self) -> None:
        """Close the source and end the factory's pool too."""
        self.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
