"""The order in which one logical stream reads the samples of one leaf dataset.

Training: the stream's slices are visited in a fresh random order every epoch; up to
``parallel_slices`` slices are open at once and the next sample is drawn from one of them with
probability proportional to what is left in it. Validation: slices in order, one at a time, once.

The reader hands out plain sample indices (``next()``). Its whole state is a few integers (epoch,
position in the epoch's slice order, the open slices' cursors, an RNG counter): the slice order itself
is recomputed from the seed on restore, so no per-epoch lists are stored. It reads no data; an
optional :class:`ReadObserver` hears which index ranges come next (remote prefetching).
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple, Protocol, TypedDict

import numpy as np

from energon import state_fields as fields
from energon.plan.rng import CounterRng, permutations, random_indices, stable_seed, stable_seeds

LOOK_AHEAD = 8  # slices announced to the observer beyond the open ones


class ReadObserver(Protocol):
    """Told which samples a reader will hand out soon, so that someone else may fetch them early.

    The reader itself does no I/O; ``pipeline/stream.py`` passes an observer that forwards the
    ranges to a remote leaf's prefetcher. Observations only affect speed, never the order or the
    state.
    """

    def will_read(self, first: int, end: int, later: bool) -> None:
        """Samples ``[first, end)`` come soon (``later``: after the ranges observed without it)."""


class ReaderState(TypedDict):
    """A :class:`SliceReader`'s whole state (plain JSON data)."""

    epoch: int
    pos: int  # slices of the epoch's order opened so far
    active: list[list[int]]  # open slices: [slice number, cursor]
    rng: int  # counter of the open-slice draw
    yielded: int  # indices handed out so far, all epochs
    started: bool


class ReaderProgress(NamedTuple):
    """Where a reader is in its epoch (a read-only view for debug logs; not part of the state)."""

    epoch: int
    started: bool
    opened: int  # slices of the epoch's order opened so far
    open_remaining: list[int]  # samples left in each open slice
    position: int  # sample positions of this epoch handed out so far (padding included)


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
        observer: ReadObserver | None = None,
    ) -> None:
        self.bounds = bounds
        self.num_slices = len(bounds) - 1
        self.seed = seed
        self.shuffle = shuffle and shuffle_over_epochs is not None
        self.over_epochs = shuffle_over_epochs if self.shuffle else 1
        self.parallel = max(1, parallel_slices) if self.shuffle else 1
        self.repeat = repeat
        self.excluded = excluded
        self._rng = CounterRng(stable_seed(seed, "slice-choice"))
        self._epoch = 0
        self._pos = 0
        self._active: list[list[int]] = []
        self._yielded = 0
        self._started = False
        self._order: np.ndarray | None = None
        self._ends = [int(b) for b in bounds[1:]]
        # The observer hears of the open slices and the next LOOK_AHEAD ones in the epoch's order
        # (``later``: not open yet, needed after the open ones). Not part of the state.
        self._observer = observer
        self._observed_until: int | None = None

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

    @property
    def parallel_slices(self) -> int:
        return self.parallel

    @property
    def shuffle_over_epochs(self) -> int | None:
        return self.over_epochs if self.shuffle else None

    def progress(self) -> ReaderProgress:
        remaining = [self._ends[i] - c for i, c in self._active]
        opened = self._slice_order()[: self._pos] if self._started else []
        sizes = sum(int(self.bounds[s + 1] - self.bounds[s]) for s in opened)
        return ReaderProgress(
            self._epoch, self._started, self._pos, remaining, sizes - sum(remaining)
        )

    def state(self) -> ReaderState:
        return {
            "epoch": self._epoch,
            "pos": self._pos,
            "active": [list(a) for a in self._active],
            "rng": self._rng.counter,
            "yielded": self._yielded,
            "started": self._started,
        }

    def restore(self, state: ReaderState, where: str = "reader") -> None:
        """Continue from ``state``, after checking every field against this reader's slices
        (a :class:`~energon.errors.StateError` naming the field otherwise)."""
        self._epoch = fields.int_field(state, "epoch", where)
        self._pos = fields.int_field(state, "pos", where, high=self.num_slices)
        # more open slices than ``parallel`` is fine (a migrated cursor whose blend weight, and
        # so share of parallel slices, shrank: they drain), more than the slices there are is not
        active = fields.list_field(
            state, "active", where, max_len=max(self.parallel, self.num_slices)
        )
        self._active = [
            self._checked_slice(entry, f"{where}.active[{i}]") for i, entry in enumerate(active)
        ]
        self._rng.counter = fields.int_field(state, "rng", where)
        self._yielded = fields.int_field(state, "yielded", where, default=0)
        self._started = fields.bool_field(state, "started", where)
        self._order = None
        self._observed_until = None
        self._check_counters(where)

    def _check_counters(self, where: str) -> None:
        """A reader cannot have handed out (or drawn for) more samples than the epochs it has read
        hold: counters beyond that are a damaged state, not a position (its cursors alone could
        not tell: they stay inside their slices)."""
        position = self.progress().position if self._started else 0
        most = self._epoch * self._most_per_epoch() + position
        for name, value in (("yielded", self._yielded), ("rng", self._rng.counter)):
            if value > most:
                raise fields.bad_field(
                    fields.path(where, name),
                    value,
                    f"at most {most} (this reader's slice holds {self.num_samples} samples; it "
                    f"has read {self._epoch} full epochs and {position} samples of epoch "
                    f"{self._epoch})",
                )

    def _most_per_epoch(self) -> int:
        """Samples one epoch can hand out: all of them once, or (slices drawn over several epochs
        or with replacement, so a slice can come twice) every opened slice at its largest."""
        if self.over_epochs == 1:
            return int(self.num_samples)
        sizes = [int(b - a) for a, b in zip(self.bounds, self.bounds[1:])]
        return self.num_slices * max(sizes, default=0)

    def _checked_slice(self, entry: object, where: str) -> list[int]:
        """An open slice ``[slice number, cursor]`` whose cursor lies inside that slice."""
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise fields.bad_field(where, entry, "[slice, cursor]")
        slice_index = fields.as_int(entry[0], f"{where}[0]", high=self.num_slices - 1)
        first, end = int(self.bounds[slice_index]), self._ends[slice_index]
        cursor = fields.as_int(entry[1], f"{where}[1]", first, end - 1)
        return [slice_index, cursor]

    def next(self) -> int:
        """The next sample index; ``StopIteration`` at the end of a pass that does not repeat."""
        while True:
            index = self._next_index()
            if index not in self.excluded:
                self._yielded += 1
                return index

    def _next_index(self) -> int:
        if not self._started:
            self._start_epoch()
        elif self._observer is not None and self._observed_until is None:
            self._observe_restored()
        while not self._active:
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
        self._order = None
        self._active = []
        self._observed_until = None  # quiet while the first slices open: all at once below
        while len(self._active) < self.parallel and self._pos < self.num_slices:
            self._open_next_slice()
        if self._observer is not None:
            self._observed_until = 0
            self._observe_ahead()

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
        if self._observer is not None and self._observed_until is not None:
            self._observe_ahead()
        entry = [slice_index, int(self.bounds[slice_index])]
        if entry[1] >= self.bounds[slice_index + 1]:
            return
        if at is None:
            self._active.append(entry)
        else:
            self._active.insert(at, entry)

    def _observe_ahead(self) -> None:
        """Tell the observer of the slices up to LOOK_AHEAD positions past the last opened one."""
        order = self._slice_order()
        stop = min(self.num_slices, self._pos + LOOK_AHEAD)
        for pos in range(self._observed_until or 0, stop):
            s = int(order[pos])
            self._observer.will_read(int(self.bounds[s]), int(self.bounds[s + 1]), pos >= self._pos)
        self._observed_until = max(self._observed_until or 0, stop)

    def _observe_restored(self) -> None:
        """After a restore: what is left of the open slices, then the slices ahead."""
        for slice_index, cursor in self._active:
            self._observer.will_read(cursor, self._ends[slice_index], False)
        self._observed_until = self._pos
        if self._pos < self.num_slices:
            self._observe_ahead()

    def _slice_order(self) -> np.ndarray:
        if self._order is None:
            self._order = self._compute_order()
        return self._order

    def _compute_order(self) -> np.ndarray:
        return self.slice_order(self._epoch)

    @property
    def rng_key(self) -> int:
        """The key of the open-slice draw (its state is the counter in :meth:`state`)."""
        return self._rng.key

    def slice_order(self, epoch: int) -> np.ndarray:
        """Slice order of ``epoch``; each slice exactly ``over_epochs`` times per super-epoch."""
        return self.slice_orders(epoch, 1)[0]

    def slice_orders(self, first_epoch: int, count: int) -> np.ndarray:
        """The slice orders of ``count`` epochs from ``first_epoch`` on, as ``[count, slices]``
        (computed together: what the ledger's fast path asks for)."""
        n = self.num_slices
        epochs = range(first_epoch, first_epoch + count)
        if not self.shuffle:
            return np.tile(np.arange(n), (count, 1))
        k = self.over_epochs
        if k == -1:
            seeds = stable_seeds((self.seed, "with-replacement"), epochs)
            return np.stack([random_indices(seed, n, n) for seed in seeds]).reshape(count, n)
        first_super = first_epoch // k
        super_epochs = range(first_super, (first_epoch + count - 1) // k + 1)
        keys = stable_seeds((self.seed, "slice-order"), super_epochs)
        full = permutations(keys, n * k) % max(n, 1)  # [super-epoch, k epochs' orders]
        each = np.arange(first_epoch, first_epoch + count)
        columns = (each % k)[:, None] * n + np.arange(n)[None, :]
        return full[(each // k - first_super)[:, None], columns]
