"""The items of a rank's workers in plan order, with lost workers replaced where they stood.

Worker ``w`` makes the rank's positions ``w, w + W, ...``, so the loader takes items from the
workers in strict round robin (skipping a worker once its items are over). While it waits for a
worker it watches it: a worker the pool reports gone, or that the stall check finds stuck, is
handed to :class:`~energon.loader.recovery.Recovery` and replaced by a new one that resumes the
lost worker's streams from the last snapshots it delivered, at its next position. Items it had
delivered and the loader has not taken yet are still handed out, in order; the sample it died on
is skipped by its stream (see :mod:`energon.loader.recovery`). None of this depends on what kind
of worker it is: any :class:`~energon.loader.workers.base.WorkerPool` will do.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from torch._utils import ExceptionWrapper

from energon.errors import WorkerRecoveryError
from energon.loader.recovery import LostSample, Recovery, WorkerGone
from energon.loader.savable_dataset import ResumePoint
from energon.loader.workers.base import WorkerPool
from energon.loader.workers.messages import Group
from energon.memory.batch_arena import NO_WORKER, BatchArena
from energon.observe.probe import INDEX, ITEMS, POSITION, STAGE, WAIT, Board, probe_state
from energon.observe.stall import StallCheck
from energon.pipeline.error_account import knows_lost_sample, with_lost_sample
from energon.pipeline.executor import ItemMeta
from energon.pipeline.snapshot import StreamSnapshot, error_state, unpacked, with_error_state
from energon.pipeline.stage import Value

POLL_SECONDS = 0.1  # how often a wait looks at the stall check and lets interruptions through


@dataclasses.dataclass
class Watch:
    """What the loader lends the reader for recovery: the rank's place in the job, its stats board
    (what each worker is on), the stall check (None: ``on_stall="report"``), how to write a report
    on a stuck worker, whether the watchdog stopped the workers (not to be replaced), a stream's
    first snapshot, and where the loader keeps the snapshots it consumed (they get the lost
    sample too)."""

    rank: int
    world_size: int
    board: Board | None
    stall: StallCheck | None
    report_stall: Callable[[int, str], str]
    stopped: Callable[[], bool]
    initial_snapshot: Callable[[int], StreamSnapshot]
    lost_sample: Callable[[LostSample], None]


class WorkerResults:
    """Iterates ``(value, meta)`` of the pool's workers in plan order (see the module docstring)."""

    def __init__(
        self,
        pool: WorkerPool,
        resume: ResumePoint,
        recovery: Recovery,
        watch: Watch,
        arena: BatchArena | None = None,
    ) -> None:
        workers = pool.num_workers
        self.pool = pool
        self.resume = resume
        self.recovery = recovery
        self.watch = watch
        self._arena = arena
        self._groups_received = [0] * workers
        self._items_received = [0] * workers
        self._pending: list[collections.deque] = [collections.deque() for _ in range(workers)]
        self._over = [False] * workers
        self._turn = 0
        # per worker: the latest snapshot of each stream it delivered, and its last position
        self._delivered: list[dict[int, Any]] = [{} for _ in range(workers)]
        # per worker: the last ItemMeta.window_streams (every stream; _delivered holds what followed)
        self._window_seen: list[Any] = [None] * workers
        self._last_position: list[int | None] = [None] * workers
        self._stalled: dict[int, str] = {}  # worker -> why the stall check stopped it
        for worker in range(workers):
            pool.start(worker, resume)

    def __iter__(self) -> WorkerResults:
        return self

    def __next__(self) -> tuple[Value, ItemMeta]:
        for _ in range(len(self._pending)):
            worker = self._turn
            self._turn = (worker + 1) % len(self._pending)
            pending = self._pending[worker]
            while not pending and not self._over[worker]:
                self._receive(worker)
            if pending:
                item = pending.popleft()
                if isinstance(item, ExceptionWrapper):
                    item.reraise()
                return item
        raise StopIteration

    def close(self) -> None:
        self.pool.close()

    # -- receiving ---------------------------------------------------------------------------
    def _receive(self, worker: int) -> None:
        """The worker's next group, queued; a lost worker replaced on the way."""
        arena = self._arena
        if arena is not None:
            arena.main_waits_for(worker, self._groups_received[worker])
        try:
            while True:
                message = self.pool.receive(worker, POLL_SECONDS)
                if message is None:
                    for other in range(self.pool.num_workers):
                        self._check_stall(other)
                elif isinstance(message, WorkerGone):
                    self._replace(message)
                else:
                    self._queue(worker, message)
                    break
                self._replace_ended(worker)
        finally:
            if arena is not None:
                arena.main_waits_for(NO_WORKER)
        self._replace_ended(worker)

    def _replace_ended(self, awaited: int) -> None:
        """Replace the other workers that ended, now rather than when their turn comes: their
        replacements work meanwhile (what they sent before is kept)."""
        for worker in self.pool.ended():
            if worker == awaited or self._over[worker]:
                continue
            while not self._over[worker]:  # (a worker that sent its last group is done)
                message = self.pool.receive(worker, 0)
                if isinstance(message, WorkerGone):
                    self._replace(message)
                    break
                if message is None:
                    break
                self._queue(worker, message)

    def _queue(self, worker: int, group: Group) -> None:
        self._groups_received[worker] += 1
        self._items_received[worker] += len(group.items)
        self._pending[worker].extend(group.items)
        if group.last:
            self._over[worker] = True
        delivered = self._delivered[worker]
        for item in group.items:
            if isinstance(item, ExceptionWrapper):
                continue
            meta = item[1]
            window = meta.window_streams
            if window is not None and window is not self._window_seen[worker]:
                delivered.clear()  # every stream moved to the window (read only on a restart)
                self._window_seen[worker] = window
            if meta.others:
                delivered.update(meta.others)
            delivered[meta.stream] = meta.snapshot
            if not meta.ended:
                self._last_position[worker] = meta.position

    def _check_stall(self, worker: int) -> None:
        stall = self.watch.stall
        if stall is None or worker in self._stalled or self._over[worker]:
            return
        why = stall.stuck(worker)
        if why is None:
            return
        self._stalled[worker] = why
        self.watch.report_stall(
            worker, f"energon watchdog: rank {self.watch.rank}: worker {worker} {why}; stopped"
        )
        self.pool.stop(worker)

    # -- replacing ---------------------------------------------------------------------------
    def _replace(self, gone: WorkerGone) -> None:
        """Recover from a lost worker (see energon.loader.recovery), or raise."""
        worker = gone.worker
        if self.watch.stopped():
            raise WorkerRecoveryError(f"{gone.who} {gone.cause}: the watchdog stopped the workers")
        why = self._stalled.pop(worker, "")
        if why:
            why = f"was stopped after being {why} (on_stall='skip')"
        lost = self.recovery.lost(gone, self._slot(worker), why)
        resume = self._resume_of(worker)
        if lost is not None:
            base = resume.snapshots.get(lost.stream) or self.watch.initial_snapshot(lost.stream)
            resume.snapshots[lost.stream] = with_lost(base, lost)
            # as if the worker had delivered it: should the replacement die before it sends
            # anything, its own replacement starts here again and must skip this sample too
            self._delivered[worker][lost.stream] = resume.snapshots[lost.stream]
            self._mark_pending(worker, lost)
            self.watch.lost_sample(lost)
        self._reset_slot(worker)
        if self.watch.stall is not None:
            self.watch.stall.forget(worker)
        self.pool.start(worker, resume, replacement=True)

    def _slot(self, worker: int) -> dict[str, Any] | None:
        board = self.watch.board
        if board is None:
            return None
        return probe_state(board.array[worker], board.hot[worker])

    def _reset_slot(self, worker: int) -> None:
        """The replacement starts on a clean slot: not on a sample, and its items counted from
        those the main process received (the stats' queue depth)."""
        board = self.watch.board
        if board is None:
            return
        hot = board.hot[worker]
        hot[STAGE], hot[INDEX], hot[POSITION] = WAIT, -1, -1
        hot[ITEMS] = self._items_received[worker]

    def _resume_of(self, worker: int) -> ResumePoint:
        """Where the replacement of ``worker`` starts: the pass's resume point with the streams
        the worker delivered, at the worker's next position."""
        snapshots = dict(self.resume.snapshots)
        window = self._window_seen[worker]  # a balanced window's streams, under what followed
        if window is not None:
            snapshots.update({s: unpacked(window[s]) for s in window})
        snapshots.update({s: unpacked(snap) for s, snap in self._delivered[worker].items()})
        base = self.resume.base
        last = self._last_position[worker]
        if last is not None:
            ranks, workers = self.watch.world_size, self.pool.num_workers
            base = last + workers * ranks - self.watch.rank - worker * ranks
        return dataclasses.replace(self.resume, base=base, snapshots=snapshots)

    def _mark_pending(self, worker: int, lost: LostSample) -> None:
        """Items of the lost worker that the loader has not taken yet carry snapshots of the
        stream without the lost sample: add it, so that a state saved after any of them skips it."""
        for i, item in enumerate(self._pending[worker]):
            if isinstance(item, ExceptionWrapper):
                continue
            value, meta = item
            if meta.stream == lost.stream:
                meta = dataclasses.replace(meta, snapshot=with_lost(meta.snapshot, lost))
            carried = (meta.others or {}).get(lost.stream)
            if carried is None and meta.stream != lost.stream and meta.window_streams:
                carried = meta.window_streams.get(lost.stream)
            if carried is not None:
                others = dict(meta.others or {})
                others[lost.stream] = with_lost(carried, lost)
                meta = dataclasses.replace(meta, others=others)
            self._pending[worker][i] = (value, meta)


def with_lost(snapshot: Any, lost: LostSample) -> StreamSnapshot:
    """``snapshot`` (maybe packed) with the lost sample pending in its error account, unless it
    holds it already."""
    snapshot = unpacked(snapshot)
    account = error_state(snapshot)
    if knows_lost_sample(account, lost.entry["error"]):
        return snapshot
    return with_error_state(snapshot, with_lost_sample(account, lost.entry))
