"""Process-local counters for remote reads, so users can see retries and traffic in their logs.

Counters live in each process (workers have their own); they are plain integers guarded by a lock
because a loader may read from several threads.
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass
class RemoteStats:
    """Totals since the process started (or since :meth:`reset`)."""

    requests: int = 0
    retries: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def reset(self) -> None:
        with self._lock:
            self.requests = self.retries = self.bytes_read = self.bytes_written = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }


STATS = RemoteStats()


def remote_stats() -> RemoteStats:
    """The counters of this process."""
    return STATS
