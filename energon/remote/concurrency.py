"""How many requests to object storage one process keeps in flight, adapted to throttling.

Object stores answer too many concurrent requests with ``SlowDown`` / HTTP 503 / 429. Retrying each
one with backoff is not enough when every prefetch thread keeps asking at full rate, so the process
also lowers its concurrency: the limit is halved on every throttling answer and raised by one after
as many successful requests in a row as the current limit (additive increase, multiplicative
decrease, like TCP's congestion control). ``remote_stats().throttled`` counts the throttling answers.

The maximum is ``ENERGON_REMOTE_MAX_CONCURRENCY`` (default 16) requests per process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from energon.remote.forksafe import ForkSafeLock
from energon.remote.stats import STATS


class AdaptiveLimit:
    """A counting gate whose size follows the store's throttling signals."""

    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.limit = self.maximum
        self._active = 0
        self._successes = 0
        self._cond = threading.Condition()

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the ``limit`` places while a request is in flight."""
        with self._cond:
            while self._active >= self.limit:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify()

    def throttled(self) -> None:
        with self._cond:
            self.limit = max(1, self.limit // 2)
            self._successes = 0
        STATS.add(throttled=1)

    def succeeded(self) -> None:
        with self._cond:
            self._successes += 1
            if self._successes >= self.limit and self.limit < self.maximum:
                self.limit += 1
                self._successes = 0
                self._cond.notify()


_limits: dict[int, AdaptiveLimit] = {}
_limits_lock = ForkSafeLock()


def process_limit() -> AdaptiveLimit:
    """This process's limit (a forked worker gets its own, never a copy of a held lock)."""
    pid = os.getpid()
    limit = _limits.get(pid)
    if limit is None:
        with _limits_lock:
            limit = _limits.setdefault(
                pid, AdaptiveLimit(int(os.environ.get("ENERGON_REMOTE_MAX_CONCURRENCY", "16")))
            )
    return limit


def reset_process_limit() -> None:
    """Start over at the maximum (tests, or after changing ``ENERGON_REMOTE_MAX_CONCURRENCY``)."""
    with _limits_lock:
        _limits.pop(os.getpid(), None)
