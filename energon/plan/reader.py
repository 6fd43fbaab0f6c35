"""The order in which one logical stream reads the samples of one leaf dataset.

Training: the stream's slices are visited in a fresh random order every epoch; up to
``parallel_slices`` slices are open at once and the next sample is drawn from one of them with
probability proportional to what is left in it. Validation: slices in order, one at a time, once.

The reader yields plain sample indices. Its whole state is a few integers (epoch, position in the
epoch's slice order, the open slices' cursors, an RNG counter): the slice order itself is recomputed
from the seed on restore, so no per-epoch lists are stored.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from energon.plan.rng import CounterRng, permutation, random_indices, stable_seed

HINT_AHEAD = 8  # slices hinted beyond the open ones


class SliceReader:
    """Sample indices of one (stream, leaf) pair, epoch after epoch."""

    def __init__(
        self,
        bounds: np.ndarray,
        *,
        seed: int,
        shuffle: bool,
        shuffle_over_epochs: int | None = 1,
        parallel_slices: int = 1,
        repeat: bool = True,
        excluded: frozenset[int] = frozenset(),
        padding: int = 0,
        pad_index: int = 0,
        hint: Callable[[int, int, bool], None] | None = None,
    ) -> None:
        self.bounds = bounds
        self.num_slices = len(bounds) - 1
        self.seed = seed
        self.shuffle = shuffle and shuffle_over_epochs is not None
        self.over_epochs = shuffle_over_epochs if self.shuffle else 1
        self.parallel = max(1, parallel_slices) if self.shuffle else 1
        self.repeat = repeat
        self.excluded = excluded
        self.padding = padding
        self.pad_index = pad_index
        self._rng = CounterRng(stable_seed(seed, "slice-choice"))
        self._epoch = 0
        self._pos = 0
        self._active: list[list[int]] = []
        self._padded = 0
        self._yielded = 0
        self._started = False
        self._order: np.ndarray | None = None
        self._ends = [int(b) for b in bounds[1:]]
        # Prefetch hints (remote data): ``hint(first, end, later)`` for the open slices and the
        # next HINT_AHEAD ones in the epoch's order (``later``: not open yet, needed after the open
        # ones). Not part of the state: hints only affect speed.
        self._hint = hint
        self._hinted_until: int | None = None

    @property
    def num_samples(self) -> int:
        return int(self.bounds[-1] - self.bounds[0])

    @property
    def yielded(self) -> int:
        """Sample indices handed out so far (all epochs)."""
        return self._yielded

    @property
    def epoch(self) -> int:
        return self._epoch

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "pos": self._pos,
            "active": [list(a) for a in self._active],
            "rng": self._rng.counter,
            "padded": self._padded,
            "yielded": self._yielded,
            "started": self._started,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self._epoch = int(state["epoch"])
        self._pos = int(state["pos"])
        self._active = [[int(i), int(c)] for i, c in state["active"]]
        self._rng.counter = int(state["rng"])
        self._padded = int(state.get("padded", 0))
        self._yielded = int(state.get("yielded", 0))
        self._started = bool(state["started"])
        self._order = None
        self._hinted_until = None

    def __iter__(self):
        return self

    def __next__(self) -> int:
        while True:
            index = self._next_index()
            if index not in self.excluded:
                self._yielded += 1
                return index

    def _next_index(self) -> int:
        if not self._started:
            self._start_epoch()
        elif self._hint is not None and self._hinted_until is None:
            self._hint_restored()
        while not self._active:
            if self._padded < self.padding:
                self._padded += 1
                return self.pad_index
            if not self.repeat or self.num_samples == 0:
                raise StopIteration
            self._epoch += 1
            self._start_epoch()
        slot = self._pick_slot()
        entry = self._active[slot]
        index = entry[1]
        entry[1] += 1
        if entry[1] >= self._ends[entry[0]]:
            self._refill(slot)
        return index

    def _start_epoch(self) -> None:
        self._started = True
        self._pos = 0
        self._padded = 0
        self._order = None
        self._active = []
        self._hinted_until = None  # no hints while the first slices open: all at once below
        while len(self._active) < self.parallel and self._pos < self.num_slices:
            self._open_next_slice()
        if self._hint is not None:
            self._hinted_until = 0
            self._hint_ahead()

    def _pick_slot(self) -> int:
        """An open slice, with probability proportional to the samples left in it."""
        active = self._active
        if len(active) == 1:
            return 0
        ends = self._ends
        remaining = [ends[i] - c for i, c in active]
        target = self._rng.randbelow(sum(remaining))
        return bisect.bisect_right(list(itertools.accumulate(remaining)), target)

    def _refill(self, slot: int) -> None:
        if self._pos < self.num_slices:
            del self._active[slot]
            self._open_next_slice(at=slot)
        else:
            del self._active[slot]

    def _open_next_slice(self, at: int | None = None) -> None:
        slice_index = int(self._slice_order()[self._pos])
        self._pos += 1
        if self._hint is not None and self._hinted_until is not None:
            self._hint_ahead()
        entry = [slice_index, int(self.bounds[slice_index])]
        if entry[1] >= self.bounds[slice_index + 1]:
            return
        if at is None:
            self._active.append(entry)
        else:
            self._active.insert(at, entry)

    def _hint_ahead(self) -> None:
        """Hint the slices up to HINT_AHEAD positions past the last opened one."""
        order = self._slice_order()
        stop = min(self.num_slices, self._pos + HINT_AHEAD)
        for pos in range(self._hinted_until or 0, stop):
            s = int(order[pos])
            self._hint(int(self.bounds[s]), int(self.bounds[s + 1]), pos >= self._pos)
        self._hinted_until = max(self._hinted_until or 0, stop)

    def _hint_restored(self) -> None:
        """After a restore: hint what is left of the open slices, then the slices ahead."""
        for slice_index, cursor in self._active:
            self._hint(cursor, self._ends[slice_index], False)
        self._hinted_until = self._pos
        if self._pos < self.num_slices:
            self._hint_ahead()

    def _slice_order(self) -> np.ndarray:
        if self._order is None:
            self._order = self._compute_order()
        return self._order

    def _compute_order(self) -> np.ndarray:
        """Slice order of the current epoch; each slice exactly ``over_epochs`` times per super-epoch."""
        n = self.num_slices
        if not self.shuffle:
            return np.arange(n)
        k = self.over_epochs
        if k == -1:
            return random_indices(stable_seed(self.seed, "with-replacement", self._epoch), n, n)
        super_epoch, part = divmod(self._epoch, k)
        key = stable_seed(self.seed, "slice-order", super_epoch)
        full = permutation(key, n * k) % max(n, 1)
        return full[part * n : (part + 1) * n]
