"""The contract of a worker pool: whatever runs a rank's executors (forked processes here; Ray
actors, say, elsewhere) and hands their messages to the loader.

A pool starts worker ``w`` of the rank with a :class:`~energon.loader.savable_dataset.ResumePoint`
(the rank's position and stream snapshots to resume from). The worker runs
``dataset.executor(w, resume)`` and sends its items in :class:`~energon.loader.workers.messages.Group`
messages, in order, at most ``prefetch`` messages ahead of what the loader has received. The pool
says when a worker is gone (:class:`~energon.loader.recovery.WorkerGone`) instead of raising, so
that :class:`~energon.loader.workers.results.WorkerResults` can replace it: the same call,
``start(w, resume, replacement=True)``, with the resume point rebuilt from what the lost worker
delivered.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from energon.loader.recovery import WorkerGone
from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.loader.workers.messages import Group
from energon.observe.probe import Board


class WorkerPool(Protocol):
    """Runs and watches the workers of one loader pass."""

    num_workers: int

    def start(self, worker: int, resume: ResumePoint, *, replacement: bool = False) -> None:
        """Start worker ``worker`` from ``resume`` (a replacement takes the place of a lost one)."""

    def receive(self, worker: int, timeout: float) -> Group | WorkerGone | None:
        """The worker's next message; :class:`WorkerGone` once it is lost (died, unreachable);
        None when nothing came within ``timeout`` seconds."""

    def ended(self) -> list[int]:
        """The workers that ended since they were started (at once, without waiting): their
        last messages may still wait in :meth:`receive`, which then reports them gone."""

    def stop(self, worker: int) -> None:
        """End the worker now (it is stuck); :meth:`receive` then reports it gone."""

    def close(self) -> None:
        """End every worker (the pass is over or abandoned)."""


@runtime_checkable
class WorkerPoolFactory(Protocol):
    """Makes the pool of each loader pass for workers other than local processes: the loader's
    ``workers=`` option (:class:`~energon.loader.workers.ray_workers.RayWorkers`). The loader runs
    ``num_workers`` workers over the dataset's logical streams, as with as many local processes."""

    num_workers: int

    def pool(
        self,
        dataset: SavableDataset,
        *,
        prefetch: int,
        pinned: bool,
        board: Board | None,
        cache_pool: Any = None,
        previous: WorkerPool | None = None,
    ) -> WorkerPool:
        """The workers of one pass: ``prefetch`` messages ahead each; ``pinned``: the loader pins
        memory; ``board``: the loader's stats board (a pool of workers that cannot open it writes
        their slots into it); ``cache_pool``: the loader's cache pool, for the workers' hooks;
        ``previous``: the pool of the loader's previous pass (closed), which may be handed back
        to run this pass with the same workers. The loader calls the pool's ``shutdown()`` when
        it is closed (``Loader.close``)."""

    def config(self) -> dict[str, Any]:
        """Plain data describing the workers (the loader's ``config()``)."""
