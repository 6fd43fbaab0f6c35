"""Process-local counters for remote reads, so users can see retries and traffic in their logs.

Counters live in each process (workers have their own); they are plain integers guarded by a lock
because a loader may read from several threads.
"""

from __future__ import annotations

import dataclasses

from energon.remote.forksafe import ForkSafeLock


@dataclasses.dataclass
class RemoteStats:
    """Totals since the process started (or since :meth:`reset`)."""

    requests: int = 0
    retries: int = 0
    throttled: int = 0  # answers asking us to slow down (SlowDown, 503, 429)
    hedged: int = 0  # second requests sent because the first was slow (the first answer wins)
    bytes_read: int = 0
    bytes_written: int = 0
    wait_seconds: float = 0.0  # time reads waited for remote bytes (0 while prefetch keeps up)
    # retries per object URL, so that a loader can say which of its sources they hit (only
    # objects that needed a retry appear: the map stays small)
    retried_objects: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    _lock: ForkSafeLock = dataclasses.field(default_factory=ForkSafeLock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def add_retry(self, url: str) -> None:
        """One retry of a request to object ``url``."""
        with self._lock:
            self.retries += 1
            self.retried_objects[url] = self.retried_objects.get(url, 0) + 1

    def reset(self) -> None:
        with self._lock:
            self.retried_objects = {}
            self.requests = self.retries = self.throttled = self.hedged = 0
            self.bytes_read = self.bytes_written = 0
            self.wait_seconds = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "throttled": self.throttled,
            "hedged": self.hedged,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "wait_seconds": round(self.wait_seconds, 3),
        }


STATS = RemoteStats()


def remote_stats() -> RemoteStats:
    """The counters of this process."""
    return STATS
