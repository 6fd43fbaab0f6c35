"""Which source a stream reads next when it mixes several (blends).

Both schedules are deterministic "largest deficit" rules rather than random draws: after ``t`` picks,
source ``i`` has been picked ``round(w_i * t)`` times give or take one, so over any window the realised
mix matches the weights to within a couple of samples (random draws would be off by about
``sqrt(t w (1-w))``). Their state is a few integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class WeightedSchedule:
    """Infinite mix by weight.

    ``phases`` (one per source, in [0, 1)) give each source a head start of ``phase * weight`` picks.
    Streams get different phases, so they do not pick their sources in lock-step (with equal weights
    and no phases every stream would read source 1, 2, 1, 2, ... at the same positions, and a global
    step of micro-batch 1 would hold one source only); a head start below one pick keeps every
    source within about one pick of ``weight * picks``.
    """

    finite = False

    def __init__(self, weights: Sequence[float], phases: Sequence[float] | None = None) -> None:
        total = sum(weights)
        if total <= 0:
            raise ValueError("a blend needs at least one source with a positive weight")
        self.weights = [w / total for w in weights]
        self.phases = list(phases) if phases is not None else [0.0] * len(weights)
        self.picks = 0
        self.counts = [0] * len(weights)

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

    def state(self) -> dict[str, Any]:
        return {"picks": self.picks, "counts": list(self.counts)}

    def restore(self, state: dict[str, Any]) -> None:
        self.picks = int(state["picks"])
        self.counts = [int(c) for c in state["counts"]]


class QuotaSchedule:
    """One pass that picks source ``i`` exactly ``quotas[i]`` times, interleaved proportionally."""

    finite = True

    def __init__(self, quotas: Sequence[int]) -> None:
        self.quotas = [int(q) for q in quotas]
        self.total = sum(self.quotas)
        self.picks = 0
        self.counts = [0] * len(self.quotas)

    @property
    def done(self) -> bool:
        return self.picks >= self.total

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

    def reset(self) -> None:
        self.picks = 0
        self.counts = [0] * len(self.quotas)

    def state(self) -> dict[str, Any]:
        return {"picks": self.picks, "counts": list(self.counts)}

    def restore(self, state: dict[str, Any]) -> None:
        self.picks = int(state["picks"])
        self.counts = [int(c) for c in state["counts"]]
