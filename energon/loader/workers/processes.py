"""A rank's worker processes, forked from the main process, each with its own pipes, replaceable one
at a time (a :class:`~energon.loader.workers.base.WorkerPool`).

Worker ``w`` sends its groups of items on a pipe of its own and makes a group only while it holds
a *credit*: the main process gives each worker ``prefetch`` credits at the start and one more for
every group it receives, so at most ``prefetch`` groups per worker are made ahead (torch's
``prefetch_factor``). A worker that is lost is seen at once: its pipe ends or its process exits
while the main process waits for it, and :meth:`ProcessPool.receive` reports it gone with the
reason (the signal that killed it, its exit code).

energon used torch's ``DataLoader`` here before. Its workers share one result queue whose writers
share a lock: a worker killed while it writes (a signal, the OOM killer) leaves the lock held or
half a message in the pipe, and every other worker's next message blocks or is garbled; it learns
of a dead worker from a ``SIGCHLD`` handler that raises in whatever code the main thread runs; and
it cannot start one worker anew. A process here otherwise behaves as a DataLoader worker: one
torch thread, ``torch.utils.data.get_worker_info()`` set, the global ``random``/``torch``/``numpy``
generators seeded as torch seeds them (for users' augmentations that draw from them), tensors sent
through shared memory (torch's reductions), ``SIGINT`` left to the main process.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import random
import select
import signal
import time
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers torch's tensor reductions for pipes)
import torch.utils.data
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import signal_handling
from torch.utils.data._utils import worker as torch_worker

from energon.loader.recovery import WorkerGone
from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.loader.workers.messages import Group, WorkerItems
from energon.memory.batch_arena import BatchArena

# Pipe capacity asked for a worker's messages (see _widen): with Linux's default 64 KiB a group of
# text batches (~600 KB) is written in many rounds, each a wake-up of both processes.
RESULT_PIPE_BYTES = 1 << 20
CREDIT = b""  # one more group may be made
STOP = b"stop"  # the pass is over: exit
# how long close() waits for the workers to exit (one finishing an item: torch waits as long)
STOP_SECONDS = 5.0
_POOLS: weakref.WeakSet[ProcessPool] = weakref.WeakSet()  # their pipes are closed in every worker


class _Process:
    """One worker process, the main process's ends of its pipes, and a poll object that waits
    for either its next message or its exit (``select.poll``: a wait costs a system call, where
    ``multiprocessing.connection.wait`` builds a selector every time)."""

    __slots__ = ("process", "results", "credits", "events")

    def __init__(self, process: Any, results: Connection, credits: Connection) -> None:
        self.process = process
        self.results = results
        self.credits = credits
        self.events = select.poll()
        self.events.register(results.fileno(), select.POLLIN)
        self.events.register(process.sentinel, select.POLLIN)

    def wait(self, timeout: float) -> tuple[bool, bool]:
        """(a message can be read, the process ended) within ``timeout`` seconds."""
        ready = {fd for fd, _ in self.events.poll(timeout * 1000)}
        return self.results.fileno() in ready, self.process.sentinel in ready

    def close_pipes(self) -> None:
        for end in (self.results, self.credits):
            try:
                end.close()
            except OSError:
                pass


class ProcessPool:
    """The forked workers of one loader pass (see the module docstring). ``arena``: the batch
    arena of the original workers (a replacement sends its batches through ordinary shared
    memory: the arena's blocks of the lost process may still be in use)."""

    def __init__(
        self,
        dataset: SavableDataset,
        num_workers: int,
        *,
        prefetch: int,
        arena: BatchArena | None,
        pinned: bool,
    ) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch = max(1, prefetch)
        self.arena = arena
        self.pinned = pinned
        self._context = multiprocessing.get_context("fork")
        self._procs: list[_Process | None] = [None] * num_workers
        # the workers' exits, watched without a wait: a poll object of their sentinels
        self._exits = select.poll()
        self._sentinels: dict[int, int] = {}  # sentinel -> worker
        self._base_seed = _base_seed()
        # each worker seeds numpy's global generator: numpy imports numpy.random on first use
        # (40-130 ms here), so import it once, here, for all workers forked from this process
        import numpy.random  # noqa: F401

        _POOLS.add(self)

    def start(self, worker: int, resume: ResumePoint, *, replacement: bool = False) -> None:
        self._end(worker)
        arena = None if replacement else self.arena
        items = WorkerItems(self.dataset, resume, arena, self.pinned)
        results, results_out = self._context.Pipe(duplex=False)
        credits_in, credits = self._context.Pipe(duplex=False)
        _widen(results)
        process = self._context.Process(
            target=_run_worker,
            args=(self, worker, items, results_out, credits_in, (results, credits)),
            name=f"energon-worker-{worker}",
            daemon=True,
        )
        process.start()
        results_out.close()
        credits_in.close()
        self._procs[worker] = _Process(process, results, credits)
        self._exits.register(process.sentinel, select.POLLIN)
        self._sentinels[process.sentinel] = worker
        for _ in range(self.prefetch):
            credits.send_bytes(CREDIT)

    def pid(self, worker: int) -> int | None:
        proc = self._procs[worker]
        return proc.process.pid if proc is not None else None

    def receive(self, worker: int, timeout: float) -> Group | WorkerGone | None:
        proc = self._procs[worker]
        if proc is None:
            raise RuntimeError(f"worker {worker} is not running")
        readable, ended = proc.wait(timeout)
        if not (readable or ended):
            return None
        # a message first: a worker may exit right after sending its last one
        if readable or proc.wait(0)[0]:
            try:
                group = proc.results.recv()
            except Exception:  # the pipe ended, or the message cannot be read: the worker is lost
                return self._gone(worker)
            try:
                proc.credits.send_bytes(CREDIT)
            except OSError:
                pass  # it is exiting; the next receive says so
            return group.pin_memory() if self.pinned else group
        return self._gone(worker)

    def ended(self) -> list[int]:
        return sorted(self._sentinels[fd] for fd, _ in self._exits.poll(0))

    def stop(self, worker: int) -> None:
        pid = self.pid(worker)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        procs = [p for p in self._procs if p is not None]
        self._procs = [None] * self.num_workers
        for proc in procs:
            self._forget_exit(proc)
            try:
                proc.credits.send_bytes(STOP)
            except OSError:
                pass
            proc.close_pipes()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in procs:
            proc.process.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.process.is_alive():
                proc.process.kill()
                proc.process.join()

    def _end(self, worker: int) -> None:
        """Forget worker ``worker``'s process (killed first if it is still there)."""
        proc = self._procs[worker]
        if proc is None:
            return
        self._procs[worker] = None
        self._forget_exit(proc)
        proc.close_pipes()
        if proc.process.is_alive():
            proc.process.kill()
        proc.process.join()

    def _forget_exit(self, proc: _Process) -> None:
        sentinel = proc.process.sentinel
        if self._sentinels.pop(sentinel, None) is not None:
            self._exits.unregister(sentinel)

    def _gone(self, worker: int) -> WorkerGone:
        proc = self._procs[worker]
        assert proc is not None
        pid = proc.process.pid
        proc.process.join(STOP_SECONDS)  # it ended, or closed its pipe: exits soon
        cause = _cause(proc.process.exitcode)
        if proc.process.exitcode is None:  # alive, but its pipe ended: it is of no use
            cause = "closed its pipe to the main process"
        self._end(worker)
        return WorkerGone(worker, f"worker {worker} (pid {pid})", cause, pid)

    def main_ends(self) -> list[Connection]:
        return [end for p in self._procs if p is not None for end in (p.results, p.credits)]


def _cause(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"was killed by signal {name}"
    if exitcode == 0:
        return "exited before its last batch"
    return f"exited with code {exitcode}"


def _widen(results: Connection) -> None:
    """Let a worker's pipe hold a whole group (``RESULT_PIPE_BYTES``) where the system allows
    it. Best effort: a smaller pipe is only slower."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is None:
        return
    try:
        fcntl.fcntl(results.fileno(), set_size, RESULT_PIPE_BYTES)
    except OSError:
        pass  # above the system's limit for this user (/proc/sys/fs/pipe-max-size)


def _base_seed() -> int:
    """The base seed torch's DataLoader would draw for these workers (its generator seeded 0: the
    global generator is not touched)."""
    generator = torch.Generator()
    generator.manual_seed(0)
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


# -- in the worker process -----------------------------------------------------------------------


def _run_worker(
    pool: ProcessPool,
    worker: int,
    items: WorkerItems,
    results: Connection,
    credits: Connection,
    own_main_ends: tuple[Connection, ...],
) -> None:
    _become_worker(pool, worker, own_main_ends, items.dataset)
    try:
        if _send_groups(worker, items.groups(worker), results, credits):
            _linger(credits)
    except (EOFError, OSError):
        pass  # the main process closed the pool, or is gone


def _become_worker(
    pool: ProcessPool, worker: int, own_main_ends: tuple[Connection, ...], dataset: Any
) -> None:
    """Set this forked process up as worker ``worker`` (see the module docstring)."""
    for end in [*own_main_ends, *(e for p in list(_POOLS) for e in p.main_ends())]:
        end.close()  # only the main process may hold them: their end is how a worker sees it go
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal_handling._set_worker_signal_handlers()  # a message on SIGSEGV / SIGBUS / SIGFPE
    torch.set_num_threads(1)
    seed = pool._base_seed + worker
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(pool._base_seed, worker))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=worker, num_workers=pool.num_workers, seed=seed, dataset=dataset
    )


def _send_groups(
    worker: int, groups: Iterator[Group], results: Connection, credits: Connection
) -> bool:
    """Send the worker's groups, each once a credit allows it; False when told to stop."""
    available = 0
    more = select.poll()  # credits that came meanwhile (Connection.poll builds a selector)
    more.register(credits.fileno(), select.POLLIN)
    while True:
        while available == 0 or more.poll(0):
            if credits.recv_bytes() == STOP:
                return False
            available += 1
        try:
            group = next(groups)
        except Exception:  # the pipeline's own errors travel inside groups; this is the wrapping
            group = Group(worker, True, [ExceptionWrapper(where=f"in worker process {worker}")])
        available -= 1
        try:
            results.send(group)
        except (OSError, EOFError):
            raise
        except Exception:  # the group cannot be pickled: say so where its items would be
            results.send(
                Group(worker, True, [ExceptionWrapper(where=f"sending from worker {worker}")])
            )
            return True
        if group.last:
            return True


def _linger(credits: Connection) -> None:
    """After the last group: stay until the main process ends the pass (it may still be fetching
    the shared memory of the tensors sent, which this process hands out)."""
    while credits.recv_bytes() != STOP:
        pass
