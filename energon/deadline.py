"""Deadlines for work that must not stall a training job (decoding one sample, extracting clips).

``with deadline(2.0, "decode of sample 'x'"):`` bounds the time of the block in two ways:

* **Interrupting (main thread only).** On the main thread of a process (the loader's worker
  processes and ``num_workers=0`` both decode there) a ``SIGALRM`` timer interrupts the block when
  it runs late and raises :class:`DecodeTimeoutError` from wherever Python code runs at that moment.
  Signals are only delivered between Python byte codes: a single C call that never returns (e.g. a
  codec stuck inside one FFmpeg call) cannot be interrupted by any in-process mechanism.
* **Cooperative (any thread).** Long loops call :func:`check_deadline` (the AV decoder does so
  after every decoded frame), which raises once the innermost active deadline has passed. This also
  works where signals cannot be used (threads other than the main thread, Windows).

Deadlines nest: an inner block never extends an outer one, and leaving a block restores the outer
timer with its remaining time. A ``SIGALRM`` timer that was set before the outermost block (the
training job's own watchdog, ``pytest-timeout``) is put back when that block ends, with its
remaining time: delayed by at most the block, never lost. ``seconds=None`` (or ``<= 0``) means
"no deadline" and costs nothing.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

from energon.errors import DecodeTimeoutError

__all__ = ["DecodeTimeoutError", "check_deadline", "deadline", "remaining_time"]


@dataclass
class _Active:
    expires_at: float  # time.monotonic() value, never later than the enclosing deadline's
    own_expires_at: float  # when this block's own budget runs out
    seconds: float
    what: str


_local = threading.local()


def _stack() -> list[_Active]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _timeout_error(stack: list[_Active], now: float) -> DecodeTimeoutError:
    """The error for the outermost block whose own budget ran out (that is the one to blame)."""
    culprit = next((a for a in stack if now >= a.own_expires_at - 1e-3), stack[-1])
    return DecodeTimeoutError(
        f"{culprit.what} took longer than its deadline of {culprit.seconds:g} s"
    )


def _can_use_signals() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _on_alarm(signum: int, frame: object) -> None:
    """SIGALRM handler: raise for the innermost deadline that has passed (if any is ours)."""
    stack = _stack()
    now = time.monotonic()
    if stack and now >= stack[-1].expires_at - 1e-3:
        raise _timeout_error(stack, now)
    if stack:  # woke up early (timer granularity): re-arm for the innermost remaining time
        signal.setitimer(signal.ITIMER_REAL, max(1e-3, stack[-1].expires_at - now))


def check_deadline() -> None:
    """Raise :class:`DecodeTimeoutError` if the innermost active deadline of this thread passed.

    Cheap (one clock read); call it from loops that may run long, e.g. once per decoded frame.
    """
    stack = getattr(_local, "stack", None)
    if stack:
        now = time.monotonic()
        if now >= stack[-1].expires_at:
            raise _timeout_error(stack, now)


def remaining_time() -> float | None:
    """Seconds left until the innermost active deadline of this thread, or None without one."""
    stack = getattr(_local, "stack", None)
    if not stack:
        return None
    return stack[-1].expires_at - time.monotonic()


_UNBOUNDED = nullcontext()  # stateless: one shared instance serves every unbounded block


def deadline(seconds: float | None, what: str = "operation") -> AbstractContextManager[None]:
    """Bound the time of the enclosed block; see the module docstring for how it is enforced.

    ``what`` names the work in the error message (e.g. ``"decode of part 'mp4' of sample 'x'"``).
    Without a bound (the default of decoding, which enters one for every part) it is a shared
    no-op context: no generator is made and nothing is armed.
    """
    if seconds is None or seconds <= 0:
        return _UNBOUNDED
    return _armed(seconds, what)


@contextmanager
def _armed(seconds: float, what: str) -> Iterator[None]:
    stack = _stack()
    own_expires_at = time.monotonic() + seconds
    expires_at = own_expires_at
    if stack:  # an inner deadline never extends the outer one
        expires_at = min(expires_at, stack[-1].expires_at)
    stack.append(_Active(expires_at, own_expires_at, seconds, what))
    use_signals = _can_use_signals()
    previous_handler = None
    foreign = None
    if use_signals:
        previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
        before = signal.setitimer(signal.ITIMER_REAL, max(1e-3, expires_at - time.monotonic()))
        if len(stack) == 1 and before[0] > 0:  # someone else's timer: give it back afterwards
            foreign = (time.monotonic() + before[0], before[1])
    try:
        yield
    finally:
        stack.pop()
        if use_signals:
            _restore_outer_timer(stack, previous_handler, foreign)


def _restore_outer_timer(
    stack: list[_Active], previous_handler: object, foreign: tuple[float, float] | None
) -> None:
    """Disarm our timer; re-arm it for the enclosing deadline, or give SIGALRM back (and the
    timer that was armed before the outermost deadline, ``(expires at, interval)``)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    if stack:
        signal.setitimer(signal.ITIMER_REAL, max(1e-3, stack[-1].expires_at - time.monotonic()))
        return
    signal.signal(signal.SIGALRM, previous_handler)  # type: ignore[arg-type]
    if foreign is not None:
        expires_at, interval = foreign
        signal.setitimer(signal.ITIMER_REAL, max(1e-3, expires_at - time.monotonic()), interval)
