"""The main-process side of a loader's live numbers: :class:`LoaderMonitor`.

It owns the loader's stats board (:mod:`energon.observe.probe`: the workers write, the monitor
reads), times how long the training loop waits for each batch (the *exposed* wait: the part of
data loading that training did not hide), runs the stall watchdog (:mod:`energon.observe.watchdog`)
and writes the optional periodic log line. A loader calls :meth:`LoaderMonitor.next_entry` instead
of ``next(source)`` and passes :meth:`LoaderMonitor.open_source`'s folder to its workers; that is
all it takes for any worker pool.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from energon.errors import WatchdogTimeout
from energon.observe import probe
from energon.observe.probe import STAGES, Board
from energon.observe.watchdog import Describe, Watchdog, stall_report

logger = logging.getLogger("energon.stats")
RECENT_WAITS = 1000  # wait percentiles are over the most recent batches


class LoaderMonitor:
    def __init__(
        self,
        num_workers: int,
        rank: int,
        describe: Describe,
        *,
        watchdog_timeout: float | None,
        watchdog_initial_timeout: float | None,
        fail_on_timeout: bool,
        sources: list[str] | None = None,
    ) -> None:
        self.num_workers = num_workers
        self.rank = rank
        self.describe = describe
        self.stall_reports: list[str] = []  # reports on stuck workers, without a watchdog
        self.sources = list(sources or [])  # source paths: retries are counted per source
        self.enabled = True  # per-stage stats and the watchdog's view of the workers
        self.board: Board | None = None
        self._probe: probe.Probe | None = None  # the main process's, without workers
        self.watchdog = (
            Watchdog(watchdog_timeout, watchdog_initial_timeout, fail_on_timeout, describe, rank)
            if watchdog_timeout
            else None
        )
        self.batches = 0
        self.wait_seconds = 0.0
        self.recent_waits: collections.deque[float] = collections.deque(maxlen=RECENT_WAITS)
        self.started: float | None = None  # first request for a batch
        self.received: dict[int, int] = {}  # worker -> items received from it
        self._received_here = 0  # from the current source
        self.log_every: float | None = None
        self._last_log = 0.0

    # -- the loader's source -----------------------------------------------------------------
    def open_source(self) -> str | None:
        """The board folder to give the workers (None: stats are off without workers). Without
        workers the main process runs the stages and writes slot 0 itself. Workers always get a
        board: what they are on is how a lost worker's sample is found
        (:mod:`energon.loader.recovery`); with stats off they read no clock."""
        self._received_here = 0
        if not self.enabled and self.num_workers == 0:
            return None
        if self.board is None:
            self.board = Board(max(1, self.num_workers), self.sources, timed=self.enabled)
            if self.watchdog is not None:
                self.watchdog.board = self.board
        if self.num_workers == 0:
            probe.activate(self.board, 0)
            self._probe = probe.ACTIVE
        return self.board.folder

    def close_source(self) -> None:
        """Items the workers made ahead are dropped with the source: they are no longer queued."""
        if self._probe is not None:
            probe.deactivate(self._probe)
            self._probe = None
        if self.board is not None:
            items = self.board.hot[:, probe.ITEMS]
            for worker in range(len(items)):
                self.received[worker] = int(items[worker])

    def next_entry(self, source: Iterator[Any]) -> Any:
        """``next(source)``, timed and watched (``WatchdogTimeout`` if it fired with fail)."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
        watchdog = self.watchdog
        if watchdog is not None:
            watchdog.begin_wait(first=self._received_here == 0)
        try:
            entry = next(source)
        except BaseException:
            failed = watchdog.end_wait() if watchdog is not None else None
            if failed is not None:
                raise WatchdogTimeout(failed) from None
            raise
        failed = watchdog.end_wait() if watchdog is not None else None
        if failed is not None:
            raise WatchdogTimeout(failed)
        waited = time.monotonic() - now
        self.wait_seconds += waited
        self.recent_waits.append(waited)
        self.batches += 1
        self._received_here += 1
        worker = getattr(entry[1], "worker", 0)
        self.received[worker] = self.received.get(worker, 0) + 1
        if self.log_every is not None and now - self._last_log >= self.log_every:
            self._last_log = now
            logger.info("%s", format_line(self.stats()))
        return entry

    # -- stuck and lost workers (energon.loader.recovery) --------------------------------------
    def report_stall(self, worker: int, headline: str) -> str:
        """Write the watchdog's report on one worker that is stopped for being stuck (kept with
        the watchdog's reports)."""
        report = stall_report(self.board, worker, self.describe, headline)
        if self.watchdog is not None:
            self.watchdog.reports.append(report)
        else:
            self.stall_reports.append(report)
        return report

    def reports(self) -> list[str]:
        """Every report written: the watchdog's and those on stuck workers."""
        return list(self.watchdog.reports if self.watchdog is not None else self.stall_reports)

    def stopped_by_watchdog(self) -> bool:
        """Whether the watchdog fired with ``fail_on_timeout`` (it kills the workers: they are not
        to be replaced, the wait ends in WatchdogTimeout)."""
        return self.watchdog is not None and self.watchdog.failed is not None

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()
        if self.board is not None:
            self.board.close()
            self.board = None

    # -- numbers -----------------------------------------------------------------------------
    def stats(self, errors: dict[str, Any] | None = None) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started if self.started is not None else 0.0
        waits = np.array(self.recent_waits) if self.recent_waits else np.zeros(1)
        workers = self._worker_stats()
        stages = {name: sum(w["seconds"][name] for w in workers) for name in STAGES}
        out: dict[str, Any] = {
            "batches": self.batches,
            "elapsed_seconds": elapsed,
            "wait_seconds": self.wait_seconds,
            "wait_fraction": self.wait_seconds / elapsed if elapsed > 0 else 0.0,
            "wait_ms": {
                "p50": float(np.percentile(waits, 50) * 1e3),
                "p95": float(np.percentile(waits, 95) * 1e3),
                "max": float(waits.max() * 1e3),
            },
            "stage_seconds": stages,
            "workers": workers,
            "watchdog_reports": len(self.reports()),
        }
        if errors is not None:
            retries = self.source_retries()
            out["sources"] = [
                {
                    "path": s["path"],
                    "split_part": s["split_part"],
                    "read": s["read"],
                    "skipped": s["skipped"],
                    "errors": dict(s.get("reasons", {})),
                    "retries": retries[i] if i < len(retries) else 0,
                }
                for i, s in enumerate(errors["sources"])
            ]
        return out

    def source_retries(self) -> list[int]:
        """Retries of remote reads per source, over this loader's processes (0s without a board:
        stats off, or nothing iterated yet)."""
        if self.board is None:
            return [0] * len(self.sources)
        return self.board.source_retries()

    def _worker_stats(self) -> list[dict[str, Any]]:
        if self.board is None or not self.enabled:
            return []
        out = []
        for worker, state in enumerate(self.board.states()):
            if not state["pid"]:
                continue
            busy = sum(v for k, v in state["seconds"].items() if k != "wait")
            out.append(
                {
                    "worker": worker,
                    "pid": state["pid"],
                    "stage": state["stage"],
                    "samples": state["samples"],
                    "items": state["items"],
                    "queue_depth": max(0, state["items"] - self.received.get(worker, 0)),
                    "samples_per_second": state["samples"] / state["elapsed"]
                    if state["elapsed"] > 0
                    else 0.0,
                    "busy_samples_per_second": state["samples"] / busy if busy > 0 else 0.0,
                    "seconds": state["seconds"],
                    "remote_retries": state["remote_retries"],
                    "remote_bytes": state["remote_bytes"],
                }
            )
            remote = self.board.remote.get(worker)
            if remote is not None:  # a Ray actor: which one, where, and its logical streams
                out[-1]["actor"] = remote.who
        return out


def format_line(stats: dict[str, Any]) -> str:
    """One log line: batches, exposed wait, the busiest stages, samples/s and queue depths."""
    stages = stats["stage_seconds"]
    busy = {k: v for k, v in stages.items() if k != "wait" and v > 0}
    total = sum(busy.values()) or 1.0
    top = ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in sorted(busy.items(), key=lambda kv: -kv[1])[:4]
    )
    workers = stats["workers"]
    rate = sum(w["samples_per_second"] for w in workers)
    depths = "/".join(str(w["queue_depth"]) for w in workers) or "-"
    skipped = sum(s["skipped"] for s in stats.get("sources", []))
    retries = sum(s["retries"] for s in stats.get("sources", []))
    return (
        f"energon stats: {stats['batches']} batches, waited {stats['wait_seconds']:.1f} s "
        f"({100 * stats['wait_fraction']:.1f}%, p95 {stats['wait_ms']['p95']:.0f} ms); "
        f"workers {rate:.0f} samples/s, queues {depths}; stages: {top or '-'}; "
        f"skipped {skipped}, retries {retries}"
    )
