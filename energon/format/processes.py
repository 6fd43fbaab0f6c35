"""How preparation starts its worker processes (shard scans, media metadata).

Fork is fastest (nothing is re-imported) but only safe while no other thread could hold a lock the
child needs; otherwise a fresh server process is used.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading


def fork_is_safe() -> bool:
    """Forking a process that runs other threads can deadlock the child on a lock one of them held.

    tqdm's monitor thread only sleeps on its own event, which the child never touches; any other
    thread makes us use a fresh server process instead.
    """
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    return all(type(t).__name__ == "TMonitor" for t in others)


def process_context(remote: bool = False) -> multiprocessing.context.BaseContext:
    """Fork when it is safe (fast start, nothing re-imported), else a clean server process.

    Remote scans use ``spawn`` instead of a fork server: a fork server started earlier would hand
    its workers the environment (endpoint, credentials) of that time, not the current one.
    """
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and sys.platform != "darwin" and fork_is_safe():
        return multiprocessing.get_context("fork")
    if "forkserver" in methods and not remote:
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")
