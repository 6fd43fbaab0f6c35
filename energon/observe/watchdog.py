"""The stall watchdog: when the training loop has waited too long for a batch, say where every
process is stuck, and (optionally) fail instead of hanging.

A loader tells its :class:`Watchdog` when it starts and stops waiting for a batch. A daemon thread
sleeps until the wait has lasted ``timeout`` seconds (``initial_timeout`` for the first batch of a
pass, which includes starting the workers), then writes a report: for every worker, its stage,
how long it has been on its current item, and the sample it is on (key, shard, dataset, from the
stats board of :mod:`energon.observe.probe`), and the Python stacks of every worker (dumped by :mod:`faulthandler`
on ``SIGUSR2``, so a worker stuck in native code answers too) and of every thread of the main
process. The report is logged (logger ``energon.watchdog``) and kept (:attr:`Watchdog.reports`).

With ``fail=True`` the waiting thread then gets :class:`~energon.errors.WatchdogTimeout` with the
report: stuck workers are killed (a pool notices dead workers at once) and the waiting thread is
interrupted. An interruption can only be delivered when that thread runs Python code again; without
workers, a call stuck in native code in the main process delays the error until it returns (the
report is written on time either way). Without ``fail`` the watchdog reports again after every
further ``timeout`` seconds of waiting.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from energon.observe.probe import STACK_SIGNAL, Board

logger = logging.getLogger("energon.watchdog")
STACK_POLLS = 50  # how many times to look for a worker's stack dump ...
STACK_POLL_SECONDS = 0.02  # ... and how long to wait between looks
# raised asynchronously in the waiting thread: a BaseException, so that stage code (which catches
# Exception) does not take it for a failed sample; the loader turns it into WatchdogTimeout
INTERRUPT = KeyboardInterrupt


Describe = Callable[[int, int], dict[str, Any]]  # (source, index) -> key, shard, dataset, ...


class Watchdog:
    def __init__(
        self,
        timeout: float,
        initial_timeout: float | None,
        fail: bool,
        describe: Describe,
        rank: int = 0,
    ) -> None:
        self.timeout = float(timeout)
        self.initial_timeout = float(initial_timeout) if initial_timeout else self.timeout
        self.fail = fail
        self.describe = describe
        self.rank = rank
        self.board: Board | None = None
        self.reports: list[str] = []
        self.failed: str | None = None  # the report of a timeout that must fail the wait
        self._cond = threading.Condition()
        self._since: float | None = None  # the clock of the next report (reset after each)
        self._began: float | None = None  # when this wait began: the reports count from it
        self._limit = self.timeout
        self._waiter: int | None = None
        self._interrupted = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._wake_at: float | None = None  # when the thread wakes next by itself (None: awake)

    # -- the waiting thread ------------------------------------------------------------------
    def begin_wait(self, first: bool) -> None:
        """Start the clock. Called for every batch, so the thread is woken only when it would
        otherwise sleep past this wait's deadline (a wake-up per batch costs the training loop
        two thread switches per batch)."""
        with self._cond:
            self._since = self._began = time.monotonic()
            self._limit = self.initial_timeout if first else self.timeout
            self._waiter = threading.get_ident()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="energon-watchdog", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or self._since + self._limit < self._wake_at:
                self._cond.notify()

    def end_wait(self) -> str | None:
        """Stop the clock; the report to fail with, if the watchdog fired with ``fail``."""
        with self._cond:
            self._since = None
            if self._interrupted:  # not delivered yet: withdraw it, the caller raises instead
                _async_raise(self._waiter, None)
                self._interrupted = False
            failed, self.failed = self.failed, None
            return failed

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    # -- the watchdog thread -----------------------------------------------------------------
    def _run(self) -> None:
        """Sleep until the current wait's deadline; between waits, for the shortest timeout, so
        that any wait begun meanwhile ends no earlier than the next wake-up (no notify needed)."""
        idle = min(self.timeout, self.initial_timeout)
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                if self._since is None:
                    self._sleep_until(now + idle, now)
                    continue
                waited = now - self._since
                if waited < self._limit:
                    self._sleep_until(self._since + self._limit, now)
                    continue
                self._fire(now - (self._began if self._began is not None else self._since))
            self._wake_at = None

    def _sleep_until(self, wake_at: float, now: float) -> None:
        self._wake_at = wake_at
        self._cond.wait(wake_at - now)
        self._wake_at = None

    def _fire(self, waited: float) -> None:
        report = self.report(waited)
        self.reports.append(report)
        logger.error("%s", report)
        if not self.fail:
            self._since = time.monotonic()  # report again after another timeout
            self._limit = self.timeout
            return
        self.failed = report
        self._since = None
        self._kill_workers()
        if self._waiter is not None:
            self._interrupted = _async_raise(self._waiter, INTERRUPT)

    def report(self, waited: float) -> str:
        lines = [
            f"energon watchdog: rank {self.rank} has waited {waited:.1f} s for a batch "
            f"(timeout {self._limit:g} s)"
        ]
        for slot, state in self._worker_states():
            lines.append(self._describe_worker(slot, state))
        lines.append(f"main process (pid {os.getpid()}) stacks:")
        lines.append(_main_stacks())
        return "\n".join(lines)

    def _worker_states(self) -> list[tuple[int, dict[str, Any]]]:
        if self.board is None:
            return []
        states = list(enumerate(self.board.states()))
        return [(slot, state) for slot, state in states if state["pid"]]

    def _describe_worker(self, slot: int, state: dict[str, Any]) -> str:
        return describe_worker(self.board, slot, state, self.describe)

    def _kill_workers(self) -> None:
        remote = self.board.remote if self.board is not None else {}
        for slot, state in self._worker_states():
            pid = state["pid"]
            if slot not in remote and pid != os.getpid() and _is_child(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def describe_worker(
    board: Board | None, slot: int, state: dict[str, Any], describe: Describe
) -> str:
    """One process of a report: its stage, how long it has been on its item, the sample it
    loaded last (key, shard, offset, dataset) and, for a worker, its stacks."""
    pid = state["pid"]
    remote = board.remote.get(slot) if board is not None else None
    if remote is not None:
        where = remote.who
    else:
        where = "main process" if pid == os.getpid() else f"worker {slot} (pid {pid})"
    line = (
        f"{where}: stage {state['stage']}, {_on_item(state)}, "
        f"{state['samples']} samples read, {state['items']} items produced"
    )
    if state["index"] >= 0:
        try:
            sample = describe(state["source"], state["index"])
        except Exception as e:  # the report must not fail because metadata does
            sample = {"error": f"{type(e).__name__}: {e}"}
        fields = ", ".join(f"{k} {v}" for k, v in sample.items())
        line += f"\n  last sample loaded: source {state['source']} index {state['index']}: {fields}"
    if remote is not None:
        line += "\n  stacks:\n" + _indent(remote.stacks(), "    ")
    elif pid != os.getpid() and board is not None:
        stack = _worker_stack(pid, board.stack_path(slot))
        line += "\n  stacks:\n" + _indent(stack, "    ")
    return line


def stall_report(board: Board, slot: int, describe: Describe, headline: str) -> str:
    """The report on one worker that the stall policy stops (energon.loader.recovery): what the
    watchdog would write about it, under ``headline``. Logged like the watchdog's reports."""
    state = board.states()[slot]
    report = f"{headline}\n{describe_worker(board, slot, state, describe)}"
    logger.error("%s", report)
    return report


def _on_item(state: dict[str, Any]) -> str:
    """How long the worker has been on its current item (or waiting since its last one)."""
    seconds = state["in_item_seconds"]
    if state["stage"] == "wait":
        return f"waiting for {seconds:.1f} s since its last item"
    return f"on its current item for {seconds:.1f} s"


def _async_raise(thread_ident: int | None, exception: type[BaseException] | None) -> bool:
    """Raise ``exception`` in thread ``thread_ident`` when it next runs Python code (None:
    withdraw a pending one). True if a thread was found."""
    if thread_ident is None:
        return False
    target = ctypes.py_object(exception) if exception is not None else ctypes.c_void_p(0)
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_ident), target) == 1


def _main_stacks() -> str:
    own = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == own:
            continue
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"  thread {names.get(ident, '?')} ({ident}):\n{_indent(stack, '    ')}")
    return "\n".join(parts)


def _worker_stack(pid: int, path: str) -> str:
    """Ask worker ``pid`` for its stacks (faulthandler writes them to ``path``)."""
    try:
        before = os.path.getsize(path)
        os.kill(pid, STACK_SIGNAL)
    except OSError as e:
        return f"(no stacks: {e})"
    size = before
    for _ in range(STACK_POLLS):
        time.sleep(STACK_POLL_SECONDS)
        now = os.path.getsize(path)
        if now > before and now == size:  # written, and no longer growing
            break
        size = now
    with open(path, errors="replace") as f:
        f.seek(before)
        text = f.read().strip()
    return text or "(the worker did not answer)"


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]) == os.getpid()
    except (OSError, IndexError, ValueError):
        return False


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())
