"""Which source a stream reads next when it mixes several (blends): the :class:`Schedule` contract.

A schedule is a small cursor over source numbers. :class:`~energon.pipeline.pointers.PointerSource`
asks it ``next()`` for every sample pointer and saves its ``state()`` with the stream; nothing else
about mixing lives anywhere else. A new way to mix (weights that change over training steps, online
reweighting) is a new class here that keeps the protocol: a pure function of its constructor
arguments and its state, so the order stays explainable and restorable.

Both schedules below are deterministic "largest deficit" rules rather than random draws: after ``t``
picks, source ``i`` has been picked ``round(w_i * t)`` times give or take one, so over any window the
realised mix matches the weights to within a couple of samples (random draws would be off by about
``sqrt(t w (1-w))``). Their state is a few integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypedDict, runtime_checkable

from energon import state_fields as fields


class ScheduleState(TypedDict):
    picks: int
    counts: list[int]  # picks per source


@runtime_checkable
class Schedule(Protocol):
    """Picks the source of each next sample of a stream.

    ``finite`` schedules end a pass (``done``) after a fixed number of picks; ``reset()`` starts the
    next pass. Infinite schedules are never ``done``.
    """

    finite: bool

    @property
    def done(self) -> bool: ...

    def next(self) -> int:
        """The source to read the next sample from."""
        ...

    def reset(self) -> None:
        """Start the next pass."""
        ...

    def state(self) -> ScheduleState: ...

    def restore(self, state: ScheduleState, where: str = "schedule") -> None:
        """Continue from ``state`` (``StateError`` naming the field if it does not fit)."""
        ...


class _DeficitCounts:
    """Picks made so far, per source: the state both schedules share."""

    def __init__(self, sources: int) -> None:
        self.picks = 0
        self.counts = [0] * sources

    def reset(self) -> None:
        self.picks = 0
        self.counts = [0] * len(self.counts)

    def state(self) -> ScheduleState:
        return {"picks": self.picks, "counts": list(self.counts)}

    def restore(self, state: ScheduleState, where: str = "schedule") -> None:
        picks = fields.int_field(state, "picks", where)
        counts = fields.list_field(state, "counts", where)
        if len(counts) != len(self.counts):
            raise fields.bad_field(f"{where}.counts", counts, f"{len(self.counts)} counts")
        counts = [fields.as_int(c, f"{where}.counts[{i}]") for i, c in enumerate(counts)]
        if sum(counts) != picks:
            raise fields.bad_field(
                f"{where}.picks", picks, f"the sum of the counts ({sum(counts)})"
            )
        self.picks, self.counts = picks, counts


class WeightedSchedule(_DeficitCounts):
    """Infinite mix by weight.

    ``phases`` (one per source, in [0, 1)) give each source a head start of ``phase * weight`` picks.
    Streams get different phases, so they do not pick their sources in lock-step (with equal weights
    and no phases every stream would read source 1, 2, 1, 2, ... at the same positions, and a global
    step of micro-batch 1 would hold one source only); a head start below one pick keeps every
    source within about one pick of ``weight * picks``.
    """

    finite = False
    done = False

    def __init__(self, weights: Sequence[float], phases: Sequence[float] | None = None) -> None:
        total = sum(weights)
        if total <= 0:
            raise ValueError("a blend needs at least one source with a positive weight")
        super().__init__(len(weights))
        self.weights = [w / total for w in weights]
        self.phases = list(phases) if phases is not None else [0.0] * len(weights)

    def next(self) -> int:
        t = self.picks + 1
        best, best_deficit = -1, float("-inf")
        for i, w in enumerate(self.weights):
            if w <= 0:
                continue
            deficit = w * (t + self.phases[i]) - self.counts[i]
            if deficit > best_deficit:
                best, best_deficit = i, deficit
        self.picks += 1
        self.counts[best] += 1
        return best


class QuotaSchedule(_DeficitCounts):
    """One pass that picks source ``i`` exactly ``quotas[i]`` times, interleaved proportionally."""

    finite = True

    def __init__(self, quotas: Sequence[int]) -> None:
        super().__init__(len(quotas))
        self.quotas = [int(q) for q in quotas]
        self.total = sum(self.quotas)

    @property
    def done(self) -> bool:
        return self.picks >= self.total

    def restore(self, state: ScheduleState, where: str = "schedule") -> None:
        super().restore(state, where)
        for i, (count, quota) in enumerate(zip(self.counts, self.quotas)):
            if count > quota:
                raise fields.bad_field(f"{where}.counts[{i}]", count, f"at most the quota {quota}")

    def next(self) -> int:
        if self.done:
            raise StopIteration
        t = self.picks + 1
        best, best_deficit = -1, float("-inf")
        for i, q in enumerate(self.quotas):
            if self.counts[i] >= q:
                continue
            deficit = q * t / self.total - self.counts[i]
            if deficit > best_deficit:
                best, best_deficit = i, deficit
        self.picks += 1
        self.counts[best] += 1
        return best
