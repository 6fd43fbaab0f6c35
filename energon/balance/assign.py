"""Composing the samples of a window of global steps into steps of near-equal rank shares.

Pure and deterministic (a function of the cost list only, ties broken by position), so every rank
computes the same composition without communicating. Steps need not cost the same, only the ranks
within a step: the straggler ratio of a step is its heaviest rank's cost over the mean of its
ranks' costs. The bound this module keeps is stated and checked in :mod:`energon.balance.bound`.

How a window is composed (:func:`compose_steps`):

1. *Skeleton.* The samples heavier than a *light* threshold go to the ``steps x ranks`` bins
   heaviest first, each to the lightest bin; the bins, sorted by load, are dealt to the steps
   ``ranks`` at a time, so the heaviest bins share a step.
2. *Levels.* Each step gets a target per rank: at least its heaviest bin, and one common level
   for the rest, so that the targets add up to the window's work (water filling). Where the
   work cannot reach every step's heaviest bin, the targets are scaled down in proportion.
3. *Fill.* The light samples, heaviest first, go to the bin with the most room below its step's
   target. A light sample ends every bin within its own size of the target. The ``steps x
   ranks`` lightest samples come last, one per bin, so that no rank of a step goes empty.
4. *Level each step.* Moves and swaps between a step's heaviest rank and its other ranks close
   the remaining gaps (until none narrows one).
5. *Repair.* A step still above the tolerance takes light samples that other steps can spare
   (they stay within the tolerance), for as long as that lowers its ratio.

Several light thresholds are tried: the level that the heaviest samples leave the other steps
(:func:`anchor_level`: samples above it anchor steps), then fractions of the mean rank share
(medium samples spread over the bins); the first composition whose every step is within the
tolerance is kept, else the best one.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Sequence

import numpy as np

from energon.balance.bound import TOLERANCE

LEVELED = 1.001  # a step this even is not leveled further (costs are estimates anyway)
# a step's total kept across exchanges is off by rounding only (far below this, relatively);
# a ratio this close to LEVELED is computed exactly
ROUNDING_MARGIN = 1e-6
# light thresholds tried in turn, as fractions of the window's mean rank share
LIGHT_FRACTIONS = (1 / 8, 1 / 2, 1.0)


def compose_steps(costs: Sequence[float], num_ranks: int, num_steps: int) -> list[list[list[int]]]:
    """``[step][rank]`` -> the indices (into ``costs``, ascending) of the samples that rank gets
    at that step of a window of ``num_steps`` global steps on ``num_ranks`` ranks. Every index
    is in exactly one share; steps may hold different numbers of samples."""
    if num_ranks < 1 or num_steps < 1:
        raise ValueError(f"need num_ranks >= 1 and num_steps >= 1, got {num_ranks}, {num_steps}")
    values = np.asarray(costs, dtype=np.float64)
    if len(values) and not (np.isfinite(values).all() and (values >= 0).all()):
        bad = int(np.flatnonzero(~np.isfinite(values) | (values < 0))[0])
        raise ValueError(
            f"sample costs must be finite and >= 0; cost {bad} is {float(values[bad])!r}"
        )
    floats = values.tolist()
    order = sorted(range(len(floats)), key=lambda i: (-floats[i], i))
    best: Composition | None = None
    best_score: tuple[float, float] | None = None
    total = float(sum(floats))
    mean_share = total / (num_ranks * num_steps)
    thresholds = [fraction * mean_share for fraction in LIGHT_FRACTIONS]
    for light in thresholds:
        composition = Composition.build(values, order, num_ranks, num_steps, light)
        score = composition.score()
        if best_score is None or score < best_score:
            best, best_score = composition, score
        if score[0] <= TOLERANCE:
            break
    assert best is not None
    best.repair()
    return best.shares()


def balance_costs(costs: Sequence[float], num_ranks: int) -> list[list[int]]:
    """For each rank, the indices (into ``costs``, ascending) of the samples it gets: one step
    composed alone."""
    return compose_steps(costs, num_ranks, 1)[0]


def straggler_ratio(rank_costs: Sequence[float]) -> float:
    """max / mean of the ranks' costs of one step (1.0: perfectly even)."""
    mean = sum(rank_costs) / len(rank_costs)
    return max(rank_costs) / mean if mean > 0 else 1.0


class Composition:
    """A window's samples in ``steps x ranks`` bins (bin ``b`` is rank ``b % ranks`` of step
    ``b // ranks``), with each bin's load."""

    def __init__(self, values: np.ndarray, num_ranks: int, num_steps: int) -> None:
        self.values = values
        self.floats: list[float] = values.tolist()  # read without numpy's per-item cost
        self.num_ranks = num_ranks
        self.num_steps = num_steps
        self.members: list[list[int]] = [[] for _ in range(num_ranks * num_steps)]
        self.loads = [0.0] * (num_ranks * num_steps)

    @classmethod
    def build(
        cls,
        values: np.ndarray,
        order: list[int],
        num_ranks: int,
        num_steps: int,
        light: float,
    ) -> Composition:
        """Skeleton, levels, fill and levelled steps for one light threshold (``order``: the
        samples heaviest first)."""
        out = cls(values, num_ranks, num_steps)
        floats = out.floats
        bins = num_ranks * num_steps
        total = float(sum(floats))
        # the `bins` lightest samples finish the bins, one each, so that no rank goes empty;
        # with no more samples than bins, each gets a bin of its own in the skeleton
        finishers = bins if len(order) > bins else 0
        rest = len(order) - finishers
        heavy = sum(1 for i in order[:rest] if floats[i] > light) if finishers else rest
        out.place_skeleton(order[:heavy])
        levels = step_levels(out.step_tops(), total, num_ranks)
        out.fill(order[heavy:rest], levels)
        out.finish(order[rest:], levels)
        for step in range(num_steps):
            out.level_step(step)
        return out

    def place_skeleton(self, heavy: list[int]) -> None:
        """The heavy samples, heaviest first, each to the lightest bin; then the bins sorted by
        load (heaviest first) and dealt to the steps in that order."""
        floats = self.floats
        members, loads = self.members, self.loads
        first = min(len(loads), len(heavy))
        for b, i in enumerate(heavy[:first]):  # one each (a zero cost would take two)
            members[b].append(i)
            loads[b] = floats[i]
        heap = [(loads[b], b) for b in range(len(loads))]
        heapq.heapify(heap)
        for i in heavy[first:]:
            load, b = heapq.heappop(heap)
            members[b].append(i)
            loads[b] = load + floats[i]
            heapq.heappush(heap, (loads[b], b))
        ordered = sorted(range(len(loads)), key=lambda b: (-loads[b], b))
        self.members = [members[b] for b in ordered]
        self.loads = [loads[b] for b in ordered]

    def step_tops(self) -> list[float]:
        """Each step's heaviest bin (the first of its bins after the skeleton)."""
        return [self.loads[s * self.num_ranks] for s in range(self.num_steps)]

    def fill(self, light: list[int], levels: list[float]) -> None:
        """``light`` (heaviest first), each to the bin with the most room below its level."""
        floats, members, loads = self.floats, self.members, self.loads
        ranks = self.num_ranks
        heap = [(loads[b] - levels[b // ranks], b) for b in range(len(loads))]
        heapq.heapify(heap)
        for i in light:
            _, b = heapq.heappop(heap)
            members[b].append(i)
            loads[b] += floats[i]
            heapq.heappush(heap, (loads[b] - levels[b // ranks], b))

    def finish(self, finishers: list[int], levels: list[float]) -> None:
        """``finishers`` (heaviest first, one per bin), each to the bin with the most room
        below its level among those without one yet."""
        floats, members, loads = self.floats, self.members, self.loads
        ranks = self.num_ranks
        heap = [(loads[b] - levels[b // ranks], b) for b in range(len(loads))]
        heapq.heapify(heap)
        for i in finishers:
            _, b = heapq.heappop(heap)
            members[b].append(i)
            loads[b] += floats[i]

    def step_bins(self, step: int) -> range:
        return range(step * self.num_ranks, (step + 1) * self.num_ranks)

    def ratio(self, step: int) -> float:
        return straggler_ratio([self.loads[b] for b in self.step_bins(step)])

    def score(self) -> tuple[float, float]:
        """(the worst step's ratio, the sum of the steps' excess over the tolerance)."""
        ratios = [self.ratio(s) for s in range(self.num_steps)]
        return max(ratios), sum(max(0.0, r - TOLERANCE) for r in ratios)

    def level_step(self, step: int) -> None:
        """Moves and swaps from the step's heaviest rank to its other ranks (lightest first),
        each narrowing their gap the most, until none narrows one or the step is within
        ``LEVELED``. Each lowers the sum of the squared loads, so this ends.

        The step's bins are kept sorted by load (two move per exchange), so a round costs a
        few bisections instead of a sort of the step; where the lightest rank cannot take an
        exchange, only the ranks holding a sample that a swap could take are tried (the others
        would refuse too, see :class:`SwapIndex`): leveling is near linear in the ranks."""
        loads = self.loads
        bins = self.step_bins(step)
        ranked = sorted((loads[b], b) for b in bins)  # lightest first, ties by bin
        total = sum([loads[b] for b in bins])  # exchanges move work, so only rounding moves it
        index = SwapIndex(self, step)
        while len(ranked) > 1 and self.above_leveled(step, ranked[-1][0], total):
            top = ranked[-1][0]
            heavy = ranked[bisect.bisect_left(ranked, (top,))][1]  # the first bin of that load
            light = self.first_taker(heavy, ranked, index)
            if light is None:
                return
            resort(ranked, heavy, top, loads[heavy])
            resort(ranked, light[1], light[0], loads[light[1]])
            index.moved(self, heavy, light[1])

    def first_taker(
        self, heavy: int, ranked: list[tuple[float, int]], index: SwapIndex
    ) -> tuple[float, int] | None:
        """The lightest ``(load, bin)`` of ``ranked`` that took an exchange from ``heavy``
        (None when none does). Moves fit the lightest rank best (the widest gap), so after it
        only ranks with a sample a swap could take are tried."""
        loads, floats = self.loads, self.floats
        lightest = ranked[0] if ranked[0][1] != heavy else ranked[1]
        if self.exchange(heavy, lightest[1]):
            return lightest
        gap = loads[heavy] - lightest[0]
        skip = (heavy, lightest[1])
        for light in index.bins_below([floats[i] for i in self.members[heavy]], gap, skip):
            before = loads[light]
            if self.exchange(heavy, light):
                return before, light
        return None

    def above_leveled(self, step: int, top: float, total: float) -> bool:
        """``self.ratio(step) > LEVELED``, from the step's heaviest load and its total (kept
        up to rounding); the exact ratio is computed only where rounding could decide."""
        mean = total / self.num_ranks
        if mean > 0:
            ratio = top / mean
            if ratio > LEVELED * (1 + ROUNDING_MARGIN):
                return True
            if ratio < LEVELED * (1 - ROUNDING_MARGIN):
                return False
        return self.ratio(step) > LEVELED

    def exchange(self, heavy: int, light: int) -> bool:
        """The move (one sample from ``heavy`` to ``light``) or swap that narrows the two bins'
        gap the most (moves ``gap / 2`` most nearly); False when none narrows it."""
        loads, members, floats = self.loads, self.members, self.floats
        gap = loads[heavy] - loads[light]
        eps = gap_epsilon(loads[heavy])
        if gap <= eps:
            return False
        theirs = sorted((floats[j], j) for j in members[light])
        values = [v for v, _ in theirs]
        best: tuple[float, int, int] | None = None  # (badness, position in heavy, sample back)
        for k, i in enumerate(members[heavy]):
            a = floats[i]
            if eps < a < gap - eps:  # a move
                best = min(best or (abs(a - gap / 2), k, -1), (abs(a - gap / 2), k, -1))
            at = bisect.bisect_left(values, a - gap / 2)
            for n in (at - 1, at):  # the swaps moving nearest to gap / 2
                if 0 <= n < len(values) and eps < a - values[n] < gap - eps:
                    candidate = (abs(a - values[n] - gap / 2), k, theirs[n][1])
                    best = min(best or candidate, candidate)
        if best is None:
            return False
        _, k, back = best
        item = members[heavy].pop(k)
        members[light].append(item)
        moved = floats[item]
        if back >= 0:
            members[light].remove(back)
            members[heavy].append(back)
            moved -= floats[back]
        loads[heavy] -= moved
        loads[light] += moved
        return True

    def repair(self) -> None:
        """Steps above the tolerance, worst first, take spare samples of other steps, until
        none can. Samples only move from steps that stay within the tolerance to steps above
        it, and a step within it never goes above it again, so this ends."""
        moved = True
        while moved:  # a step that got within the tolerance may spare samples for another
            moved = False
            stragglers = [s for s in range(self.num_steps) if self.ratio(s) > TOLERANCE]
            for step in sorted(stragglers, key=lambda s: (-self.ratio(s), s)):
                while self.ratio(step) > TOLERANCE and self.take_spare(step):
                    self.level_step(step)
                    moved = True

    def take_spare(self, step: int) -> bool:
        """Moves to the step's lightest rank the sample of another step that lowers this step's
        ratio the most while its own step stays within the tolerance (and each of its ranks
        keeps a sample); False when none does."""
        loads, members, floats = self.loads, self.members, self.floats
        ranks = self.num_ranks
        bins = self.step_bins(step)
        light = min(bins, key=lambda b: (loads[b], b))
        top = max(loads[b] for b in bins)
        mean = sum(loads[b] for b in bins) / ranks
        now = top / mean if mean > 0 else 1.0
        best: tuple[float, int, int] | None = None  # (ratio after, sample, its bin)
        for donor in range(self.num_steps):
            if donor == step:
                continue
            donor_bins = self.step_bins(donor)
            heaviest = max(donor_bins, key=lambda b: (loads[b], -b))
            runner_up = max((loads[b] for b in donor_bins if b != heaviest), default=0.0)
            donor_total = sum(loads[b] for b in donor_bins)
            for b in donor_bins:
                if len(members[b]) < 2:
                    continue  # a rank keeps at least one sample
                others = runner_up if b == heaviest else loads[heaviest]
                for i in members[b]:
                    x = floats[i]
                    after = max(top, loads[light] + x) / (mean + x / ranks)
                    if after >= now - 1e-12 or (best is not None and (after, i) >= best[:2]):
                        continue
                    rest = donor_total - x
                    if rest > 0 and max(others, loads[b] - x) * ranks <= TOLERANCE * rest:
                        best = (after, i, b)
        if best is None:
            return False
        _, i, b = best
        members[b].remove(i)
        loads[b] -= floats[i]
        members[light].append(i)
        loads[light] += floats[i]
        self.level_step(b // ranks)
        return True

    def shares(self) -> list[list[list[int]]]:
        ranks = self.num_ranks
        return [
            [sorted(self.members[s * ranks + r]) for r in range(ranks)]
            for s in range(self.num_steps)
        ]


class SwapIndex:
    """The samples of one step sorted by cost, with the bin each is in. A swap takes a sample
    ``a`` of the heavy bin for a sample ``v`` of a lighter one with ``0 < a - v < gap``, so only
    the bins holding a sample within ``gap`` below one of the heavy bin's are worth trying.
    Arrays, so that a query costs the samples it finds, not a Python loop over them."""

    def __init__(self, composition: Composition, step: int) -> None:
        members = composition.members
        bins = composition.step_bins(step)
        self.first = bins.start
        self.loads = np.array([composition.loads[b] for b in bins])
        ids = np.array([i for b in bins for i in members[b]], dtype=np.int64)
        holders = np.repeat(np.arange(len(bins)), [len(members[b]) for b in bins])
        order = np.argsort(composition.values[ids], kind="stable")
        self.values = composition.values[ids][order]
        self.holders = holders[order]  # the bin (from the step's first) of each sorted sample
        self.slot = dict(zip(ids[order].tolist(), range(len(order))))  # sample -> sorted place

    def moved(self, composition: Composition, *bins: int) -> None:
        """The samples and loads of ``bins`` changed (an exchange between them)."""
        for b in bins:
            self.loads[b - self.first] = composition.loads[b]
            for i in composition.members[b]:
                self.holders[self.slot[i]] = b - self.first

    def bins_below(self, costs: list[float], gap: float, skip: tuple[int, ...]) -> Iterator[int]:
        """The bins but ``skip`` holding a sample ``v`` with ``a - gap <= v <= a`` for a cost
        ``a`` of ``costs``, widened by far more than rounding, by ``(load, bin)`` (a superset
        is safe: the caller tries them in turn; a bin left out is one no swap can narrow). The
        first costs one pass over the samples found; the rest, rarely needed, a sort."""
        tops = np.asarray(costs, dtype=np.float64)
        low = np.searchsorted(self.values, tops - gap - 1e-9 * (np.abs(tops) + gap), "left")
        high = np.searchsorted(self.values, tops, "right")
        ranges = [np.arange(lo, hi) for lo, hi in zip(low.tolist(), high.tolist()) if hi > lo]
        if not ranges:
            return
        holders = self.holders[np.concatenate(ranges)]
        keep = np.ones(len(holders), dtype=bool)
        for b in skip:
            keep &= holders != b - self.first
        holders = holders[keep]
        if not len(holders):
            return
        loads = self.loads[holders]
        first = int(holders[loads == loads.min()].min())
        yield first + self.first
        found = np.unique(holders)
        for b in found[np.lexsort((found, self.loads[found]))].tolist():
            if b != first:
                yield b + self.first


def resort(ranked: list[tuple[float, int]], b: int, before: float, after: float) -> None:
    """Bin ``b``'s entry in the load-sorted ``ranked`` moved from load ``before`` to ``after``."""
    del ranked[bisect.bisect_left(ranked, (before, b))]
    bisect.insort(ranked, (after, b))


def gap_epsilon(scale: float) -> float:
    """Differences below this are rounding, not imbalance (keeps the leveling loop finite)."""
    return 1e-12 * max(1.0, abs(scale))


def step_levels(tops: list[float], total: float, num_ranks: int) -> list[float]:
    """Each step's target cost per rank: its heaviest bin, and one common level ``T`` for the
    rest, such that ``num_ranks * sum(levels) == total``; where the work cannot reach every
    step's heaviest bin (``num_ranks * sum(tops) > total``), the tops scaled down alike."""
    steps = len(tops)
    if num_ranks * sum(tops) > total:
        scale = total / (num_ranks * sum(tops))
        return [top * scale for top in tops]
    ranked = sorted(tops, reverse=True)
    fixed = 0.0
    common = 0.0
    for j in range(steps):  # the j heaviest steps keep their top as their level
        common = (total / num_ranks - fixed) / (steps - j)
        if common >= ranked[j]:
            break
        fixed += ranked[j]
    return [max(common, top) for top in tops]
