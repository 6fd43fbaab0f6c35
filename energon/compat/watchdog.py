"""``megatron.energon.watchdog``: a general-purpose watchdog timer under the reference's names.

energon's loaders have their own stall watchdog (``energon.observe.watchdog``: per-worker reports,
``get_loader(watchdog_timeout_seconds=...)``); this one is the small timer that reference-style code
uses directly: a deadline that ``enable()`` / ``reset()`` push out and ``disable()`` clears, a
context manager, and ``watch_iter`` that times only the ``next()`` calls of an iterator. When the
deadline passes it dumps every thread's stack and calls ``callback`` (default: end the process).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["PRINT_LOCAL_MAX_LENGTH", "Watchdog", "repr_short"]

PRINT_LOCAL_MAX_LENGTH = 250

T = TypeVar("T")


def repr_short(obj: Any) -> str:
    """``repr(obj)``, its middle cut out when longer than ``PRINT_LOCAL_MAX_LENGTH``."""
    text = repr(obj)
    if len(text) <= PRINT_LOCAL_MAX_LENGTH:
        return text
    half = PRINT_LOCAL_MAX_LENGTH // 2
    return f"{text[:half]}...{text[-half:]}"


class Watchdog:
    """Fires ``callback`` when ``timeout`` seconds (``initial_timeout`` the first time) pass
    without ``reset()`` / ``enable()`` while enabled."""

    def __init__(
        self,
        timeout: float,
        initial_timeout: float | None = None,
        callback: Callable[[], None] | None = None,
        dump_stacks: bool = True,
        enabled: bool = True,
    ) -> None:
        self.timeout = timeout
        self.initial_timeout = initial_timeout
        self.callback = callback
        self.dump_stacks = dump_stacks
        self._deadline: float | None = None
        self._first = True
        self._finished = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()
        if enabled:
            self.enable()

    def _run(self) -> None:
        with self._cond:
            while not self._finished:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._deadline = None
                self._fire()

    def _fire(self) -> None:
        if self.dump_stacks:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.callback is not None:
            self.callback()
            return
        print(f"Watchdog: no progress for {self.timeout} s, exiting", file=sys.stderr, flush=True)
        os._exit(1)

    def enable(self) -> None:
        """(Re-)arm: the deadline is ``timeout`` seconds from now (``initial_timeout`` once)."""
        with self._cond:
            if self._finished:
                return
            timeout = self.timeout
            if self._first and self.initial_timeout is not None:
                timeout = self.initial_timeout
            self._first = False
            self._deadline = time.monotonic() + timeout
            self._cond.notify()

    def reset(self) -> None:
        """Push the deadline out by ``timeout`` seconds, if enabled."""
        with self._cond:
            if self._deadline is not None:
                self._deadline = time.monotonic() + self.timeout
                self._cond.notify()

    def disable(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    def finish(self) -> None:
        """Stop for good (the timer thread ends)."""
        with self._cond:
            self._finished = True
            self._deadline = None
            self._cond.notify()

    def watch_iter(self, iterable: Iterable[T]) -> Iterator[T]:
        """The items of ``iterable``; only the time inside its ``next()`` calls is watched."""
        iterator = iter(iterable)
        while True:
            self.enable()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.disable()
            yield item

    def __enter__(self) -> Watchdog:
        self.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disable()
