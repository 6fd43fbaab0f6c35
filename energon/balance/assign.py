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
   (Placed in rounds over all bins, the choices of a heap at a cost per sample that hardly
   grows with the bins: :mod:`energon.balance.placement`.)
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
import itertools
from collections.abc import Sequence

import numpy as np

from energon.balance.bound import TOLERANCE
from energon.balance.placement import line_up, place_heaviest_first
from energon.balance.swaps import Exchanged, SwapIndex

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
    order = np.argsort(-values, kind="stable")  # heaviest first, ties by position
    best: Composition | None = None
    best_score: tuple[float, float] | None = None
    total = float(sum(floats))
    mean_share = total / (num_ranks * num_steps)
    thresholds = [fraction * mean_share for fraction in LIGHT_FRACTIONS]
    for light in thresholds:
        composition = Composition.build(values, floats, order, num_ranks, num_steps, light)
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


def place_skeleton(
    values: np.ndarray, heavy: np.ndarray, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """The heavy samples, heaviest first, each to the lightest bin; then the bins renumbered
    by load (heaviest first, ties by bin), the order in which they are dealt to the steps.
    Returns the bins' loads (renumbered) and each heavy sample's bin."""
    loads = np.zeros(bins)
    first = min(bins, len(heavy))
    loads[:first] = values[heavy[:first]]  # one each (a zero cost would take two)
    rest = place_heaviest_first(loads, np.zeros(bins), values[heavy[first:]])
    ordered = np.argsort(-loads, kind="stable")
    number = np.empty(bins, dtype=np.int64)
    number[ordered] = np.arange(bins)
    return loads[ordered], number[np.concatenate([np.arange(first), rest])]


def group_by_bin(samples: np.ndarray, bin_of: np.ndarray, bins: int) -> list[list[int]]:
    """Each bin's ``samples`` (``bin_of`` gives each one's bin) in their order in ``samples``."""
    by_bin = np.argsort(bin_of, kind="stable")
    return split_by_bin(samples[by_bin], np.bincount(bin_of, minlength=bins).tolist())


def split_by_bin(samples: np.ndarray, sizes: list[int]) -> list[list[int]]:
    """``samples`` grouped by bin (bin 0's first), cut into lists of ``sizes``."""
    flat = samples.tolist()
    ends = list(itertools.accumulate(sizes))
    return [flat[end - size : end] for size, end in zip(sizes, ends)]


class Composition:
    """A window's samples in ``steps x ranks`` bins (bin ``b`` is rank ``b % ranks`` of step
    ``b // ranks``), with each bin's load."""

    def __init__(
        self,
        values: np.ndarray,
        floats: list[float],
        num_ranks: int,
        num_steps: int,
        members: list[list[int]],
        loads: list[float],
    ) -> None:
        self.values = values
        self.floats = floats  # ``values``, read without numpy's per-item cost
        self.num_ranks = num_ranks
        self.num_steps = num_steps
        self.members = members
        self.loads = loads

    @classmethod
    def build(
        cls,
        values: np.ndarray,
        floats: list[float],
        order: np.ndarray,
        num_ranks: int,
        num_steps: int,
        light: float,
    ) -> Composition:
        """Skeleton, levels, fill and levelled steps for one light threshold (``order``: the
        samples heaviest first)."""
        bins = num_ranks * num_steps
        # the `bins` lightest samples finish the bins, one each, so that no rank goes empty;
        # with no more samples than bins, each gets a bin of its own in the skeleton
        finishers = bins if len(order) > bins else 0
        rest = len(order) - finishers
        heavy = int(np.count_nonzero(values[order[:rest]] > light)) if finishers else rest
        loads, skeleton = place_skeleton(values, order[:heavy], bins)
        levels = step_levels(loads[::num_ranks].tolist(), float(sum(floats)), num_ranks)
        level_of = np.repeat(np.array(levels, dtype=np.float64), num_ranks)
        filled = place_heaviest_first(loads, level_of, values[order[heavy:rest]])
        finished = line_up(loads - level_of, finishers)
        loads[finished] += values[order[rest:]]
        members = group_by_bin(order, np.concatenate([skeleton, filled, finished]), bins)
        out = cls(values, floats, num_ranks, num_steps, members, loads.tolist())
        for step in range(num_steps):
            out.level_step(step)
        return out

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
        index = SwapIndex(self.values, self.members, loads, bins)  # built when first asked
        while len(ranked) > 1 and self.above_leveled(step, ranked[-1][0], total):
            top = ranked[-1][0]
            heavy = ranked[bisect.bisect_left(ranked, (top,))][1]  # the first bin of that load
            taken = self.first_taker(heavy, ranked, index)
            if taken is None:
                return
            before, light, moved = taken
            resort(ranked, heavy, top, loads[heavy])
            resort(ranked, light, before, loads[light])
            index.moved(heavy, light, moved)

    def first_taker(
        self, heavy: int, ranked: list[tuple[float, int]], index: SwapIndex
    ) -> tuple[float, int, Exchanged] | None:
        """The lightest ``(load, bin)`` of ``ranked`` that took an exchange from ``heavy``, and
        the samples exchanged (None when none does). Moves fit the lightest rank best (the
        widest gap), so after it only ranks with a sample a swap could take are tried."""
        loads, floats = self.loads, self.floats
        lightest = ranked[0] if ranked[0][1] != heavy else ranked[1]
        moved = self.exchange(heavy, lightest[1])
        if moved is not None:
            return lightest[0], lightest[1], moved
        gap = loads[heavy] - lightest[0]
        skip = (heavy, lightest[1])
        costs = [floats[i] for i in self.members[heavy]]
        for light in index.bins_below(costs, gap, skip, ranked):
            before = loads[light]
            moved = self.exchange(heavy, light)
            if moved is not None:
                return before, light, moved
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

    def exchange(self, heavy: int, light: int) -> Exchanged | None:
        """The move (one sample from ``heavy`` to ``light``) or swap that narrows the two bins'
        gap the most (moves ``gap / 2`` most nearly); None when none narrows it."""
        loads, members, floats = self.loads, self.members, self.floats
        gap = loads[heavy] - loads[light]
        eps = gap_epsilon(loads[heavy])
        if gap <= eps:
            return None
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
            return None
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
        return item, back

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
        """``[step][rank]`` -> the bin's samples, ascending."""
        sizes = [len(m) for m in self.members]
        samples = np.fromiter(itertools.chain.from_iterable(self.members), np.int64, sum(sizes))
        bins = np.repeat(np.arange(len(sizes)), sizes)
        by_bin = split_by_bin(samples[np.lexsort((samples, bins))], sizes)
        ranks = self.num_ranks
        return [by_bin[s * ranks : (s + 1) * ranks] for s in range(self.num_steps)]


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
