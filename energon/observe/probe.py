"""What runs in a worker: where its time goes and what it is working on, in a shared board.

A loader makes a *board* (:class:`Board`): small files in shared memory with one fixed slot per
worker. Each worker (or the main process, without workers) opens its slot (:func:`activate`) and
its stages write into it as they work: the stage it is in, the sample it is loading (source,
index), counts of samples and items, retries per source, and the seconds spent per stage. Reading
the board needs no message from the worker, so the main process sees a stuck worker's state too
(:mod:`energon.observe.watchdog`). The same folder gets each worker's stack dump, written by
:mod:`faulthandler` (in C, so it works while the worker is stuck in native code) when the
watchdog sends ``SIGUSR2``.

Cheap enough to leave on, also for samples that take tens of microseconds:

- on the hot path (every sample, every stage switch) a stage writes integers only, into the
  slot's int64 row (:data:`HOT`): the stage code, the sample's source and index, the sample count.
  No clock, no call;
- stage *times* are measured on sampled items only: the first :data:`TIMED_FIRST` items and then
  every :data:`TIMED_EVERY`-th (a *timed cycle* runs from one item boundary of the executor to the
  next, its wait included). In a timed cycle every switch reads the clock and charges the time
  since the last switch to the stage it leaves, so stage times are exclusive (batching pulls
  encoded samples, which pull loaded ones; each is charged only for its own work). A reader scales
  the timed seconds by (time active / time in timed cycles): an unbiased estimate, since which
  items are timed does not depend on what they contain;
- the float row (times, totals) is written in bulk, at the end of timed cycles;
- retries per source: at every item boundary (and when a pass ends) the probe compares the
  process's remote retry counter (:data:`energon.remote.stats.STATS`, which also counts retries
  per object URL) with what it saw; new retries are counted for the source whose path holds the
  object, in the slot's int64 row after the fixed fields. Retries of fetches that threads make
  ahead are counted at the next item boundary.

The per-sample call sites (the load stage, the decoder, task encoder hooks) inline
:func:`switch` / :func:`back`: a function call would cost more than the stores.
"""

from __future__ import annotations

import faulthandler
import json
import mmap
import multiprocessing.util
import os
import signal
import sys
import tempfile
import time
from typing import IO, Any

import numpy as np

from energon.remote.stats import STATS

# stage codes; "wait": outside the executor (the pool waits for requests or queue space);
# "plan": pointer stages and the executor's own loop
STAGES = ("wait", "plan", "read", "decode", "encode", "batch", "transfer")
WAIT, PLAN, READ, DECODE, ENCODE, BATCH, TRANSFER = range(len(STAGES))

# float64 fields of a slot, written at the end of timed cycles: process id, when it started,
# seconds active and seconds in timed cycles (the scale of the stage times), when they were
# written, remote counters of the process
PID, STARTED, ACTIVE_SECONDS, TIMED_SECONDS, PUBLISHED, RETRIES, REMOTE_BYTES = range(7)
TIMES = 7  # TIMES + code: seconds spent in stage `code` during timed cycles
SLOT_FIELDS = TIMES + len(STAGES)
# int64 fields of a slot, written on the hot path: stage code, the sample being loaded (source,
# index), samples read, items made, when the current item began (monotonic ns), the global
# micro-batch position of the item being made (what a lost worker's recovery reads); then one
# retry counter per source of the loader
STAGE, SOURCE, INDEX, SAMPLES, ITEMS, ITEM_SINCE_NS, POSITION = range(7)
HOT_FIELDS = 7
TIMED_FIRST = 4  # the first items of a process are all timed ...
TIMED_EVERY = 16  # ... then one item in this many
STACK_SIGNAL = signal.SIGUSR2


def _shared_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class Board:
    """The shared slots of one loader pass (created by the main process, opened by workers).

    ``sources`` are the paths of the loader's sources (their roots: a retry of a request to an
    object under one of them counts for that source). ``timed=False``: the processes only store
    what they are on (stage, sample, counts) and never read a clock (stats off; the watchdog and
    the recovery of lost workers still read the slots)."""

    def __init__(
        self,
        slots: int,
        sources: list[str] | None = None,
        folder: str | None = None,
        timed: bool = True,
    ):
        self.folder = folder or tempfile.mkdtemp(prefix="energon-board-", dir=_shared_folder())
        self.slots = slots
        self.sources = [str(source) for source in sources or []]
        self.timed = timed
        with open(os.path.join(self.folder, "sources.json"), "w") as f:
            json.dump({"sources": self.sources, "timed": timed}, f)
        self.hot_width = HOT_FIELDS + len(self.sources)
        self.buffer = _create(os.path.join(self.folder, "slots"), slots * SLOT_FIELDS)
        self.hot_buffer = _create(os.path.join(self.folder, "hot"), slots * self.hot_width)
        self.array = np.frombuffer(self.buffer, dtype=np.float64).reshape(slots, SLOT_FIELDS)
        self.hot = np.frombuffer(self.hot_buffer, dtype=np.int64).reshape(slots, self.hot_width)
        self.hot[:, INDEX] = -1
        self.hot[:, POSITION] = -1
        # slots whose process runs elsewhere (a Ray actor): slot -> an object with `who` and
        # `stacks()`; the pool writes their rows here (no signal can reach them)
        self.remote: dict[int, Any] = {}
        # removed when the board is dropped or at exit, also when nobody calls close() (a loader
        # left to the garbage collector), only by the process that made it (never a forked
        # worker). multiprocessing's finalizer, not weakref.finalize: it also runs when a
        # multiprocessing child (mp.spawn ranks) ends, which skips atexit.
        self._remove = multiprocessing.util.Finalize(
            self, _remove_folder, args=(self.folder, os.getpid()), exitpriority=0
        )

    def stack_path(self, slot: int) -> str:
        return os.path.join(self.folder, f"stack-{slot}.txt")

    def states(self) -> list[dict[str, Any]]:
        """Every slot as plain numbers (:func:`probe_state`)."""
        floats = np.array(self.array, copy=True)
        hot = np.array(self.hot, copy=True)
        return [probe_state(floats[i], hot[i]) for i in range(self.slots)]

    def source_retries(self) -> list[int]:
        """Retries per source, summed over the slots."""
        return [int(n) for n in self.hot[:, HOT_FIELDS:].sum(axis=0)]

    def close(self) -> None:
        self._remove()


def _create(path: str, fields: int) -> mmap.mmap:
    with open(path, "wb") as f:
        f.write(bytes(fields * 8))
    return _map(path)


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() != owner:
        return
    for key in [k for k in _probes if k[0] == folder]:
        del _probes[key]
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _map(path: str) -> mmap.mmap:
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), os.fstat(f.fileno()).st_size)


def _row(buffer: mmap.mmap, fmt: str, slot: int, width: int) -> memoryview:
    """Row ``slot`` of ``buffer`` (a memoryview: the cheapest per-field store in Python)."""
    return memoryview(buffer).cast(fmt)[slot * width : (slot + 1) * width]


class Probe:
    """One process's slot: the stage it is in, the sample it is on, time per stage."""

    def __init__(
        self,
        slot: memoryview,
        hot: memoryview,
        sources: list[str],
        stack_file: IO[str] | None = None,
        timed: bool = True,
    ) -> None:
        self.slot = slot
        self.hot = hot
        self.sources = sources
        self.stack_file = stack_file
        now = time.monotonic()
        self.activated = now
        self.since = now  # the last stage switch (read in timed cycles only)
        self.cycle_start = now
        self.cycles = 0
        self.timed = timed  # False: no cycle is ever timed (stats off)
        self.timing = timed
        slot[PID] = os.getpid()
        if not slot[STARTED]:  # a later pass's worker continues the slot's totals
            slot[STARTED] = now
        self.times = [slot[TIMES + code] for code in range(len(STAGES))]
        self.timed = slot[TIMED_SECONDS]
        self.active0 = slot[ACTIVE_SECONDS]
        slot[PUBLISHED] = now
        hot[STAGE] = WAIT
        hot[ITEM_SINCE_NS] = time.monotonic_ns()
        # bound now: at interpreter exit, when an unfinished pass is closed, `sys` may be gone
        self._interpreter_ending = sys.is_finalizing
        self._retries0 = slot[RETRIES] - STATS.retries  # this process's remote counters
        self._bytes0 = slot[REMOTE_BYTES] - STATS.bytes_read
        self._retries_seen = STATS.retries
        self._objects_seen = dict(STATS.retried_objects)
        self._source_of_object: dict[str, int | None] = {}

    def enter(self, stage: int) -> int:
        """Switch to ``stage``; returns the previous stage, to switch back to."""
        hot = self.hot
        previous = hot[STAGE]
        hot[STAGE] = stage
        if self.timing:
            self.switched(previous)
        return previous

    def switched(self, ended: int) -> None:
        """In a timed cycle: charge the time since the last switch to stage ``ended``."""
        now = time.monotonic()
        self.times[ended] += now - self.since
        self.since = now

    def produced(self) -> None:
        self.hot[ITEMS] += 1

    def cycle(self) -> None:
        """An item boundary of the executor: close this cycle, decide whether the next is timed."""
        global TIMING
        now_ns = time.monotonic_ns()
        self.hot[ITEM_SINCE_NS] = now_ns
        if STATS.retries != self._retries_seen:
            self._count_source_retries()
        self.cycles += 1
        was_timed = self.timing
        self.timing = self.timed and (self.cycles < TIMED_FIRST or self.cycles % TIMED_EVERY == 0)
        if not (was_timed or self.timing):
            return
        now = now_ns / 1e9
        if was_timed:
            self.switched(self.hot[STAGE])
            self.timed += now - self.cycle_start
            self.publish(now)
        self.cycle_start = self.since = now
        TIMING = self.timing

    def publish(self, now: float | None = None) -> None:
        """Write the times and totals into the float row (in bulk)."""
        now = time.monotonic() if now is None else now
        slot = self.slot
        for code, seconds in enumerate(self.times):
            slot[TIMES + code] = seconds
        slot[TIMED_SECONDS] = self.timed
        slot[ACTIVE_SECONDS] = self.active0 + now - self.activated
        slot[PUBLISHED] = now
        slot[RETRIES] = self._retries0 + STATS.retries
        slot[REMOTE_BYTES] = self._bytes0 + STATS.bytes_read

    def finish(self) -> None:
        """The process stops working for this board: count what is left and publish."""
        if self._interpreter_ending():
            return  # a loader left unfinished at exit: module globals are gone, nobody reads on
        if STATS.retries != self._retries_seen:
            self._count_source_retries()
        now = time.monotonic()
        if self.timing:
            self.switched(self.hot[STAGE])
            self.timed += now - self.cycle_start
            self.cycle_start = now
        self.publish(now)

    def _count_source_retries(self) -> None:
        """Retries since the last look, per object, counted for the source holding the object."""
        objects = dict(STATS.retried_objects)
        for url, count in objects.items():
            new = count - self._objects_seen.get(url, 0)
            if new > 0:
                source = self._source_of(url)
                if source is not None:
                    self.hot[HOT_FIELDS + source] += new
        self._objects_seen = objects
        self._retries_seen = STATS.retries

    def _source_of(self, url: str) -> int | None:
        """The source whose path is the longest prefix of ``url`` (the first, if listed twice)."""
        if url not in self._source_of_object:
            best, length = None, -1
            for i, root in enumerate(self.sources):
                root = root.rstrip("/")
                if (url == root or url.startswith(root + "/")) and len(root) > length:
                    best, length = i, len(root)
            self._source_of_object[url] = best
        return self._source_of_object[url]


class _Off:
    """The probe of a process without a board: every call does nothing."""

    timing = False

    def enter(self, stage: int) -> int:
        return WAIT

    def switched(self, ended: int) -> None:
        pass

    def produced(self) -> None:
        pass

    def cycle(self) -> None:
        pass

    def finish(self) -> None:
        pass


OFF = _Off()
_NOWHERE = memoryview(bytearray(8 * HOT_FIELDS)).cast("q")  # hot stores without a board
#: this process's probe; :data:`OFF` until :func:`activate`
ACTIVE: Probe | _Off = OFF
#: this process's int64 row (:data:`_NOWHERE` without a board): stages store into it directly
HOT: memoryview = _NOWHERE
#: whether the current cycle is timed (stage switches then also call ``ACTIVE.switched``)
TIMING = False
# this process's probes by (board folder, slot, pid): several loaders without workers share the
# main process, and each executor puts its own probe back when it resumes (:func:`install`)
_probes: dict[tuple[str, int, int], Probe] = {}


def switch(stage: int) -> int:
    """Enter ``stage`` (an integer store; a clock only in timed cycles); returns the stage to go
    back to with :func:`back`. The per-sample call sites (the load stage, the decoder, task
    encoder hooks) inline these few lines: a function call would cost more than they do."""
    hot = HOT
    previous = hot[STAGE]
    hot[STAGE] = stage
    if TIMING:
        ACTIVE.switched(previous)
    return previous


def back(previous: int, stage: int) -> None:
    """Leave ``stage`` for ``previous`` (what :func:`switch` returned)."""
    HOT[STAGE] = previous
    if TIMING:
        ACTIVE.switched(stage)


def activate(board: Board | str | None, slot: int) -> None:
    """Open ``slot`` of ``board`` as this process's probe: a :class:`Board` in the process that made
    it (its stacks are taken by the watchdog in Python), or the board's folder in a worker, which
    then also dumps its stacks into that folder on ``SIGUSR2``."""
    if board is None:
        install(OFF)
        return
    folder = board.folder if isinstance(board, Board) else board
    key = (folder, slot, os.getpid())
    if key in _probes:
        install(_probes[key])
        return
    if isinstance(board, Board):
        buffer, hot_buffer, sources, timed, stack_file = (
            board.buffer,
            board.hot_buffer,
            board.sources,
            board.timed,
            None,
        )
    else:
        buffer = _map(os.path.join(folder, "slots"))
        hot_buffer = _map(os.path.join(folder, "hot"))
        with open(os.path.join(folder, "sources.json")) as f:
            described = json.load(f)
        sources, timed = described["sources"], described["timed"]
        stack_file = open(os.path.join(folder, f"stack-{slot}.txt"), "w")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    width = HOT_FIELDS + len(sources)
    probe = Probe(
        _row(buffer, "d", slot, SLOT_FIELDS),
        _row(hot_buffer, "q", slot, width),
        sources,
        stack_file,
        timed,
    )
    _probes[key] = probe
    install(probe)


def install(probe: Probe | _Off) -> None:
    """Make ``probe`` this process's active probe (the stages write into its slot)."""
    global ACTIVE, HOT, TIMING
    ACTIVE = probe
    HOT = probe.hot if isinstance(probe, Probe) else _NOWHERE
    TIMING = probe.timing


def deactivate(probe: Probe | _Off | None = None) -> None:
    """Publish and forget ``probe`` (default: the active one; the main process, when its loader
    pass ends); back to :data:`OFF` if it was active."""
    probe = ACTIVE if probe is None else probe
    probe.finish()
    for key in [k for k, p in _probes.items() if p is probe]:
        del _probes[key]
    if probe is ACTIVE:
        install(OFF)


def probe_state(slot: np.ndarray, hot: np.ndarray) -> dict[str, Any]:
    """A slot (its float and int rows) as plain numbers (for stats and the watchdog). Stage
    seconds are the timed seconds scaled to the time the process was active; the time since the
    last publication counts for the stage it is in now."""
    now = time.monotonic()
    stage = int(hot[STAGE])
    timed = float(slot[TIMED_SECONDS])
    scale = float(slot[ACTIVE_SECONDS]) / timed if timed > 0 else 1.0
    times = {name: float(slot[TIMES + code]) * scale for code, name in enumerate(STAGES)}
    started = bool(slot[PID])
    if started:
        times[STAGES[stage]] += max(0.0, now - float(slot[PUBLISHED]))
    in_item = max(0.0, now - int(hot[ITEM_SINCE_NS]) / 1e9) if started else 0.0
    return {
        "pid": int(slot[PID]),
        "stage": STAGES[stage],
        "in_item_seconds": in_item,
        "source": int(hot[SOURCE]),
        "index": int(hot[INDEX]),
        "samples": int(hot[SAMPLES]),
        "items": int(hot[ITEMS]),
        "position": int(hot[POSITION]),
        "remote_retries": int(slot[RETRIES]),
        "remote_bytes": int(slot[REMOTE_BYTES]),
        "seconds": times,
        "elapsed": max(0.0, now - float(slot[STARTED])) if started else 0.0,
    }
