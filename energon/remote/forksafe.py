"""A lock that a forked child process gets fresh.

Remote reads run on background threads; if one of them holds a module's lock at the moment the
process forks (a DataLoader starting its workers), the child's copy of that lock stays locked forever.
These locks are replaced in the child right after the fork.
"""

from __future__ import annotations

import os
import threading


class ForkSafeLock:
    """``with lock: ...`` like ``threading.Lock``; renewed in a forked child."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)
