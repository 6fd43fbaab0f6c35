"""What runs in a worker: where its time goes and what it is working on, in a shared board.

A loader makes a *board* (:class:`Board`): a small file in shared memory with one fixed slot of
float64 fields per worker. Each worker (or the main process, without workers) opens its slot
(:func:`activate`) and its stages write into it as they work (:data:`ACTIVE`): the stage it is in
and since when, the last sample it loaded (source, index), counts of samples and items, and the
seconds spent per stage. Writing a slot is a few array stores, cheap enough to leave on; reading
it needs no message from the worker, so the main process sees a stuck worker's state too
(:mod:`energon.observe.watchdog`). The same file's folder gets each worker's stack dump, written by
:mod:`faulthandler` (in C, so it works while the worker is stuck in native code) when the
watchdog sends ``SIGUSR2``.

Stage times are exclusive: a stage that pulls from the one before it (batching pulls encoded
samples, which pull loaded ones) is charged only for its own work, because every instrumented
call site switches the slot's stage and switches back (:meth:`Probe.enter`).
"""

from __future__ import annotations

import faulthandler
import mmap
import multiprocessing.util
import os
import signal
import tempfile
import time
from typing import IO, Any

import numpy as np

from energon.remote.stats import STATS

# stage codes; "wait": outside the executor (the pool waits for requests or queue space);
# "plan": pointer stages and the executor's own loop
STAGES = ("wait", "plan", "read", "decode", "encode", "batch", "transfer")
WAIT, PLAN, READ, DECODE, ENCODE, BATCH, TRANSFER = range(len(STAGES))

# slot fields (float64 each)
PID, STARTED, STAGE, SINCE, SOURCE, INDEX, SAMPLES, ITEMS, RETRIES, REMOTE_BYTES = range(10)
TIMES = 10  # TIMES + code: seconds spent in stage `code`
SLOT_FIELDS = TIMES + len(STAGES)
STACK_SIGNAL = signal.SIGUSR2


def _shared_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class Board:
    """The shared slots of one loader pass (created by the main process, opened by workers)."""

    def __init__(self, slots: int, folder: str | None = None) -> None:
        self.folder = folder or tempfile.mkdtemp(prefix="energon-board-", dir=_shared_folder())
        self.path = os.path.join(self.folder, "slots")
        self.slots = slots
        with open(self.path, "wb") as f:
            f.write(bytes(slots * SLOT_FIELDS * 8))
        self.buffer = _map(self.path, slots)
        self.array = np.frombuffer(self.buffer, dtype=np.float64).reshape(slots, SLOT_FIELDS)
        self.array[:, INDEX] = -1
        # removed when the board is dropped or at exit, also when nobody calls close() (a loader
        # left to the garbage collector), only by the process that made it (never a forked
        # worker). multiprocessing's finalizer, not weakref.finalize: it also runs when a
        # multiprocessing child (mp.spawn ranks) ends, which skips atexit.
        self._remove = multiprocessing.util.Finalize(
            self, _remove_folder, args=(self.folder, os.getpid()), exitpriority=0
        )

    def stack_path(self, slot: int) -> str:
        return os.path.join(self.folder, f"stack-{slot}.txt")

    def read(self) -> np.ndarray:
        """A copy of every slot (rows: slots, columns: the fields above)."""
        return np.array(self.array, copy=True)

    def close(self) -> None:
        self._remove()


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() != owner:
        return
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


def _map(path: str, slots: int) -> mmap.mmap:
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), slots * SLOT_FIELDS * 8)


def _slot(buffer: mmap.mmap, slot: int) -> memoryview:
    """Slot ``slot`` as float64 fields (a memoryview: the cheapest per-field store in Python)."""
    return memoryview(buffer).cast("d")[slot * SLOT_FIELDS : (slot + 1) * SLOT_FIELDS]


class Probe:
    """One process's slot: the stage it is in, the sample it is on, time per stage."""

    def __init__(self, slot: memoryview, stack_file: IO[str] | None = None) -> None:
        self.slot = slot
        self.stack_file = stack_file
        self.stage = WAIT
        self.since = time.monotonic()
        slot[PID] = os.getpid()
        if not slot[STARTED]:  # a later pass's worker continues the slot's totals
            slot[STARTED] = self.since
        slot[SINCE] = self.since
        slot[STAGE] = WAIT
        self._retries0 = slot[RETRIES] - STATS.retries  # this process's remote counters
        self._bytes0 = slot[REMOTE_BYTES] - STATS.bytes_read

    def enter(self, stage: int) -> int:
        """Switch to ``stage`` (charging the time since the last switch to the previous one);
        returns the previous stage, to switch back to."""
        now = time.monotonic()
        slot = self.slot
        previous = self.stage
        slot[TIMES + previous] += now - self.since
        slot[STAGE] = stage
        slot[SINCE] = now
        self.stage = stage
        self.since = now
        return previous

    def loading(self, source: int, index: int) -> None:
        slot = self.slot
        slot[SOURCE] = source
        slot[INDEX] = index

    def loaded(self) -> None:
        self.slot[SAMPLES] += 1

    def produced(self) -> None:
        slot = self.slot
        slot[ITEMS] += 1
        slot[RETRIES] = self._retries0 + STATS.retries
        slot[REMOTE_BYTES] = self._bytes0 + STATS.bytes_read


class _Off:
    """The probe of a process without a board: every call does nothing."""

    stage = WAIT

    def enter(self, stage: int) -> int:
        return WAIT

    def loading(self, source: int, index: int) -> None:
        pass

    def loaded(self) -> None:
        pass

    def produced(self) -> None:
        pass


OFF = _Off()
#: this process's probe (stages call it); :data:`OFF` until :func:`activate`
ACTIVE: Probe | _Off = OFF
_activated: tuple[str, int, int] | None = None  # (board path, slot, pid)


def activate(board: Board | str | None, slot: int) -> None:
    """Open ``slot`` of ``board`` as this process's probe: a :class:`Board` in the process that made
    it (its stacks are taken by the watchdog in Python), or the board's folder in a worker, which
    then also dumps its stacks into that folder on ``SIGUSR2``."""
    global ACTIVE, _activated
    if board is None:
        ACTIVE = OFF
        _activated = None
        return
    folder = board.folder if isinstance(board, Board) else board
    if _activated == (folder, slot, os.getpid()):
        return
    path = os.path.join(folder, "slots")
    slots = os.path.getsize(path) // (SLOT_FIELDS * 8)
    buffer = board.buffer if isinstance(board, Board) else _map(path, slots)
    stack_file = None
    if not isinstance(board, Board):
        stack_file = open(os.path.join(folder, f"stack-{slot}.txt"), "w")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True, chain=False)
    ACTIVE = Probe(_slot(buffer, slot), stack_file)
    _activated = (folder, slot, os.getpid())


def deactivate() -> None:
    """Back to :data:`OFF` (the main process, when its loader pass ends)."""
    global ACTIVE, _activated
    ACTIVE = OFF
    _activated = None


def probe_state(slot: np.ndarray) -> dict[str, Any]:
    """A slot as plain numbers (for stats and the watchdog)."""
    now = time.monotonic()
    stage = int(slot[STAGE])
    times = {name: float(slot[TIMES + code]) for code, name in enumerate(STAGES)}
    times[STAGES[stage]] += max(0.0, now - float(slot[SINCE]))  # the stage it is in now
    return {
        "pid": int(slot[PID]),
        "stage": STAGES[stage],
        "in_stage_seconds": max(0.0, now - float(slot[SINCE])),
        "source": int(slot[SOURCE]),
        "index": int(slot[INDEX]),
        "samples": int(slot[SAMPLES]),
        "items": int(slot[ITEMS]),
        "remote_retries": int(slot[RETRIES]),
        "remote_bytes": int(slot[REMOTE_BYTES]),
        "seconds": times,
        "elapsed": max(0.0, now - float(slot[STARTED])) if slot[PID] else 0.0,
    }
