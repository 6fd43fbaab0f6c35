"""Which of a step's bins could take a swap from its heaviest bin: the index that keeps the
composition's leveling (:meth:`energon.balance.assign.Composition.level_step`) from trying
every rank of the step when its lightest rank refuses an exchange."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np

#: an exchange between two bins: (the sample moved to the lighter bin, the sample moved back
#: to the heavier one, or -1 for a plain move)
Exchanged = tuple[int, int]


class SwapIndex:
    """The samples of one step sorted by cost, with the bin each is in. A swap takes a sample
    ``a`` of the heavy bin for a sample ``v`` of a lighter one with ``0 < a - v < gap``, so only
    the bins holding a sample within ``gap`` below one of the heavy bin's are worth trying.

    Built when first asked (a step whose lightest rank always takes the exchange never needs
    it) and kept current from the samples each exchange moved. Arrays, so that a query costs a
    few numpy passes over the samples it finds, not a Python loop over them."""

    def __init__(
        self, values: np.ndarray, members: list[list[int]], loads: list[float], bins: range
    ) -> None:
        self.all_values = values
        self.members = members
        self.bin_loads = loads
        self.bins = bins
        self.first = bins.start
        self.built = False

    def build(self) -> None:
        members, bins = self.members, self.bins
        self.loads = np.array([self.bin_loads[b] for b in bins])
        ids = np.array([i for b in bins for i in members[b]], dtype=np.int64)
        holders = np.repeat(np.arange(len(bins)), [len(members[b]) for b in bins])
        order = np.argsort(self.all_values[ids], kind="stable")
        self.values = self.all_values[ids][order]
        self.holders = holders[order]  # the bin (from the step's first) of each sorted sample
        self.slot = dict(zip(ids[order].tolist(), range(len(order))))  # sample -> sorted place
        self.built = True

    def moved(self, heavy: int, light: int, exchanged: Exchanged) -> None:
        """An exchange moved ``exchanged`` between the bins ``heavy`` and ``light``."""
        if not self.built:
            return
        item, back = exchanged
        self.loads[heavy - self.first] = self.bin_loads[heavy]
        self.loads[light - self.first] = self.bin_loads[light]
        self.holders[self.slot[item]] = light - self.first
        if back >= 0:
            self.holders[self.slot[back]] = heavy - self.first

    def bins_below(
        self,
        costs: list[float],
        gap: float,
        skip: tuple[int, ...],
        ranked: list[tuple[float, int]],
    ) -> Iterator[int]:
        """The bins but ``skip`` holding a sample ``v`` with ``a - gap <= v <= a`` for a cost
        ``a`` of ``costs``, widened by far more than rounding, by ``(load, bin)`` (a superset
        is safe: the caller tries them in turn; a bin left out is one no swap can narrow).
        ``ranked``: the step's ``(load, bin)``, sorted. The first costs one pass over the
        samples found; the rest, rarely needed, a sort."""
        if not self.built:
            self.build()
        tops = np.asarray(costs, dtype=np.float64)
        low = np.searchsorted(self.values, tops - gap - 1e-9 * (np.abs(tops) + gap), "left")
        high = np.searchsorted(self.values, tops, "right")
        spans = merged_spans(low.tolist(), high.tolist())
        first = self.lightest_holder(spans, skip, ranked)
        if first is None:
            return
        yield first
        found = self.swap_holders(tops, gap, skip[0], spans)
        found = found[~np.isin(found, [b - self.first for b in skip])]
        for b in found[np.lexsort((found, self.loads[found]))].tolist():
            if b + self.first != first:
                yield b + self.first

    def swap_holders(
        self, tops: np.ndarray, gap: float, heavy: int, spans: list[tuple[int, int]]
    ) -> np.ndarray:
        """The bins (from the step's first) holding a sample of ``spans`` that could still take
        a swap from ``heavy`` within their own, narrower gap: ``a - gap_b <= v <= a`` for a cost
        ``a`` of ``tops``, widened as the spans are (a superset). A bin heavier than the
        lightest has less room, so most of the bins found for the lightest's gap refuse; this
        leaves them out without an exchange tried each."""
        places = np.concatenate([np.arange(*span) for span in spans])
        holders, values = self.holders[places], self.values[places]
        ascending = np.sort(tops)
        above = np.minimum(np.searchsorted(ascending, values, "left"), len(ascending) - 1)
        nearest = ascending[above]  # the lowest cost at or above each sample (if any)
        gaps = self.loads[heavy - self.first] - self.loads[holders]
        near = values >= nearest - gaps - 1e-9 * (np.abs(nearest) + gap)
        return np.unique(holders[(values <= nearest) & near])

    def lightest_holder(
        self, spans: list[tuple[int, int]], skip: tuple[int, ...], ranked: list[tuple[float, int]]
    ) -> int | None:
        """The bin of the lowest ``(load, bin)`` but ``skip`` holding a sample of ``spans``
        (sorted places); None when there is none."""
        loads, holders = self.loads, self.holders
        kept = [(b - self.first, loads[b - self.first]) for b in skip]
        loads[[b for b, _ in kept]] = np.inf  # left out for the search
        try:
            best, best_load = -1, np.inf
            for lo, hi in spans:
                part = loads[holders[lo:hi]]
                k = int(part.argmin())
                if part[k] < best_load:
                    best, best_load = int(holders[lo + k]) + self.first, float(part[k])
        finally:
            for b, load in kept:
                loads[b] = load
        if best < 0:
            return None
        # another bin of the same load comes first if its number is lower and it qualifies
        at = bisect.bisect_left(ranked, (best_load,))
        while ranked[at][1] != best and (
            ranked[at][1] in skip or not self.holds(ranked[at][1], spans)
        ):
            at += 1
        return ranked[at][1]

    def holds(self, b: int, spans: list[tuple[int, int]]) -> bool:
        """Whether bin ``b`` holds a sample whose sorted place is in one of ``spans``."""
        places = [self.slot[i] for i in self.members[b]]
        return any(lo <= p < hi for p in places for lo, hi in spans)


def merged_spans(low: list[int], high: list[int]) -> list[tuple[int, int]]:
    """The union of the non-empty ranges ``[low[k], high[k])`` as disjoint ranges, ascending."""
    spans: list[tuple[int, int]] = []
    for lo, hi in sorted(zip(low, high)):
        if hi <= lo:
            continue
        if spans and lo <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
        else:
            spans.append((lo, hi))
    return spans
