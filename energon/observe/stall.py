"""Stuck workers: which worker has been on one sample (or one item) longer than a deadline.

The main process looks at the stats board (:mod:`energon.observe.probe`) while it waits for a
worker. A worker never reads a clock for this: "on one sample for T seconds" is its count of
samples read unchanged, outside the stage ``wait``, over T seconds of the main process's looks;
"on one item" is the time since its current item began (the board's item clock). The loader's
recovery (:mod:`energon.loader.recovery`, ``on_stall="skip"``) stops such a worker and replaces it.
"""

from __future__ import annotations

import time

from energon.observe.probe import ITEM_SINCE_NS, SAMPLES, STAGE, STAGES, WAIT, Board

PER = ("sample", "batch")


class StallCheck:
    """Whether a worker is stuck: ``seconds`` on one sample (``per="sample"``) or on one item
    (``per="batch"``)."""

    def __init__(self, board: Board, seconds: float, per: str = "sample") -> None:
        if per not in PER:
            raise ValueError(f"stall_timeout_per must be one of {PER}, got {per!r}")
        self.board = board
        self.seconds = seconds
        self.per = per
        self._seen: dict[int, tuple[int, float]] = {}  # worker -> (samples read, since when)

    def stuck(self, worker: int) -> str | None:
        """Why ``worker`` counts as stuck (None: it is not)."""
        hot = self.board.hot[worker]
        stage = int(hot[STAGE])
        if stage == WAIT:
            self._seen.pop(worker, None)
            return None
        if self.per == "batch":
            on = max(0.0, (time.monotonic_ns() - int(hot[ITEM_SINCE_NS])) / 1e9)
        else:
            now, samples = time.monotonic(), int(hot[SAMPLES])
            seen = self._seen.get(worker)
            if seen is None or seen[0] != samples:
                self._seen[worker] = (samples, now)
                return None
            on = now - seen[1]
        if on < self.seconds:
            return None
        return (
            f"stuck for {on:.1f} s on one {self.per} (stage {STAGES[stage]}; "
            f"stall_timeout_seconds={self.seconds:g})"
        )

    def forget(self, worker: int) -> None:
        """A new process took the worker's place."""
        self._seen.pop(worker, None)
