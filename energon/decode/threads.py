"""Decoding a batch's images on threads while the loader's thread goes on (``decode_threads``).

JPEG decoding (libjpeg-turbo, through simplejpeg) releases the GIL, so a process that loads
without worker processes (``num_workers=0``) can decode the images of a batch on several cores
while its own thread reads and builds the next samples. Only the decode moves: reading, building
samples, error handling, stats and everything the user sees stay on the loader's thread and in
order, so batches, states and error accounts are the same with any number of threads.

How it fits together:

* The load stage opens a :class:`DecodeWindow` around the loading of each sample.
* While one is open on the thread, ``decode_image`` hands each JPEG it would decode on the fast
  path (:mod:`energon.decode.jpeg`) to :meth:`DecodeWindow.submit` and returns a
  :class:`~energon.decode.pending.PendingImage` whose pixels arrive later.
* The load stage waits for a sample's window (:meth:`DecodeWindow.succeeded`) before the sample
  leaves it. A decode that did not take the fast path or failed is not handled on the thread: the
  load stage loads that sample again the ordinary way, so its value or its error is exactly what
  a loader without threads gives.
* The batch writes the images of such samples into their padded slots on the same threads
  (:func:`run_on_threads`, from ``energon.samples.collate``).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = [
    "DecodeWindow",
    "check_decode_threads",
    "current_window",
    "default_decode_threads",
    "run_on_threads",
    "window_open",
]

#: threads used by default when a process loads by itself (no worker processes)
MAX_DEFAULT_THREADS = 4


def default_decode_threads(num_workers: int) -> int:
    """Threads that decode images: with worker processes their number already decides the
    parallelism (1: decode on the worker's thread); without, the cores this process may use, up
    to 4. ``ENERGON_DECODE_THREADS`` overrides both."""
    configured = os.environ.get("ENERGON_DECODE_THREADS")
    if configured:
        return check_decode_threads(_as_int(configured), "ENERGON_DECODE_THREADS")
    if num_workers > 0:
        return 1
    return max(1, min(MAX_DEFAULT_THREADS, _usable_cores()))


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def check_decode_threads(value: Any, name: str = "decode_threads") -> int:
    """``value`` as a thread count, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be an integer >= 1 (1: decode on the loader's thread), got {value!r}"
        )
    return value


def _as_int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


_executors: dict[tuple[int, int], ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    """This process's pool of ``threads`` decode threads (a forked child makes its own: threads
    do not survive a fork)."""
    key = (os.getpid(), threads)
    with _executors_lock:
        executor = _executors.get(key)
        if executor is None:
            executor = ThreadPoolExecutor(
                threads, thread_name_prefix="energon-decode", initializer=_name_os_thread
            )
            _executors[key] = executor
        return executor


def _name_os_thread() -> None:
    """Give the thread its name in the OS as well (``top -H``, ``py-spy``, ``/proc/*/task/*/comm``
    show "energon-decode"); Linux only, best effort."""
    try:
        libc = ctypes.CDLL(None)
        name = threading.current_thread().name.encode()[:15]
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


_PR_SET_NAME = 15


class DecodeWindow:
    """The decodes handed to threads while one sample was loaded."""

    __slots__ = ("threads", "_futures")

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._futures: list[Future[bool]] = []

    def submit(self, decode: Callable[..., bool], *args: Any) -> None:
        """Run ``decode(*args)`` on a thread; it returns whether it produced the value."""
        self._futures.append(_executor(self.threads).submit(decode, *args))

    @property
    def submitted(self) -> bool:
        """Whether a decode was handed to a thread."""
        return bool(self._futures)

    def succeeded(self) -> bool:
        """Wait for every decode of the window; True if all produced their value (False if one
        did not take the fast path or raised: the caller then loads the sample again)."""
        ok = True
        for future in self._futures:
            try:
                ok = future.result() and ok
            except Exception:
                ok = False
        return ok


def run_on_threads(threads: int, work: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``work(item)`` for every item on ``threads`` threads, the calling thread one of them; each
    takes the next item left when it is done with one (images differ in size, so equal runs would
    leave threads idle). Returns when all are done, raising the first error."""
    if threads <= 1 or len(items) <= 1:
        for item in items:
            work(item)
        return
    indices = itertools.count()  # next() on it is atomic under the GIL

    def take_items() -> None:
        for index in indices:
            if index >= len(items):
                return
            work(items[index])

    futures = [_executor(threads).submit(take_items) for _ in range(min(threads, len(items)) - 1)]
    try:
        take_items()
    finally:
        for future in futures:
            future.result()


class _Current(threading.local):
    window: DecodeWindow | None = None


_current = _Current()


def current_window() -> DecodeWindow | None:
    """The window open on this thread, if any."""
    return _current.window


def window_open(window: DecodeWindow | None) -> DecodeWindow | None:
    """Make ``window`` (None: none) the open one on this thread; returns the previous one."""
    previous = _current.window
    _current.window = window
    return previous
