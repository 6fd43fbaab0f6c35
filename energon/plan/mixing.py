"""Which source a stream reads next when it mixes several (blends): the :class:`Schedule` contract.

A schedule is a small cursor over source numbers. :class:`~energon.pipeline.pointers.PointerSource`
asks it ``next()`` for every sample pointer and saves its ``state()`` with the stream; nothing else
about mixing lives anywhere else. A new way to mix is a new class here that keeps the protocol: a
pure function of its constructor arguments and its state, so the order stays explainable and
restorable. Weights that change over training (:mod:`energon.plan.schedules`) and weight changes
made online are part of :class:`WeightedSchedule`, so anything that runs the pointer stages (the
ledger, ``energon blend-plan``) sees them.

Both schedules below are deterministic "largest deficit" rules rather than random draws: after ``t``
picks, source ``i`` has been picked ``round(w_i * t)`` times give or take one (with changing
weights: the sum of its weights over the picks so far), so over any window the realised mix matches
the weights to within a couple of samples (random draws would be off by about ``sqrt(t w (1-w))``).
Their state is a few numbers.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, Protocol, TypedDict, runtime_checkable

from energon import state_fields as fields
from energon.errors import StateError
from energon.plan.schedules import FlatWeights, WeightChange, WeightFunction


class ScheduleState(TypedDict, total=False):
    picks: int
    counts: list[int]  # picks per source
    expected: list[float]  # weighted schedules: target counts (for reports; not read on restore)
    correction: list[float]  # weighted schedules whose weights change: see WeightedSchedule
    regime: int  # ... and the position of the online weight change in force (-1: none)
    sizes: list[float]  # schedules weighted by size: the size picked per source


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
    """Infinite mix by weight: fixed weights, a weight schedule, and weight changes made online.

    ``weights`` are fixed weights (one number per source) or a
    :class:`~energon.plan.schedules.WeightFunction` of the global sample clock: pick ``k`` (0-based)
    of this stream happens at clock ``k * num_streams + stream``. ``present[i]`` is False for a
    source that has no samples in this stream (its weight counts as 0). At every pick the raw
    weights are normalised to sum to 1.

    ``phases`` (one per source, in [0, 1)) give each source a head start of ``phase * weight`` picks.
    Streams get different phases, so they do not pick their sources in lock-step (with equal weights
    and no phases every stream would read source 1, 2, 1, 2, ... at the same positions, and a global
    step of micro-batch 1 would hold one source only); a head start below one pick keeps every
    source within about one pick of its target.

    The rule: pick the source ``i`` with ``w_i > 0`` and the largest deficit
    ``w_i * (k + 1 + phase_i) - counts_i + correction_i`` (the first one on ties), where ``w`` are
    the weights in force at pick ``k``. ``correction_i`` is 0 while weights stay fixed; when they
    change from ``w`` to ``w'`` before pick ``k`` it grows by ``(w_i - w'_i) * k``, so that
    ``correction_i + w_i * k`` is always the sum of ``w_i`` over all picks so far: the target count
    follows the integral of the time-varying weights. ``changes`` (global micro-batch position ->
    weights, see :class:`~energon.plan.schedules.WeightChange`) take effect when the stream calls
    :meth:`begin_item` with the item number where they start.
    """

    finite = False
    done = False

    def __init__(
        self,
        weights: Sequence[float] | WeightFunction,
        phases: Sequence[float] | None = None,
        *,
        stream: int = 0,
        num_streams: int = 1,
        present: Sequence[bool] | None = None,
        changes: Sequence[WeightChange] = (),
    ) -> None:
        if not hasattr(weights, "weights_at"):
            values = [float(w) for w in weights]  # type: ignore[union-attr]
            if sum(values) <= 0:
                raise ValueError("a blend needs at least one source with a positive weight")
            weights = FlatWeights.constant(values)
        self.base: WeightFunction = weights  # type: ignore[assignment]
        sources = len(weights.weights_at(0))
        super().__init__(sources)
        self.phases = list(phases) if phases is not None else [0.0] * sources
        self.present = list(present) if present is not None else [True] * sources
        self.stream = stream
        self.num_streams = num_streams
        self.changes = sorted(changes, key=lambda c: c.position)
        self._change_items = [c.first_item(stream, num_streams) for c in self.changes]
        self.dynamic = bool(self.changes) or weights.stable_until(0) is not None
        self.regime = -1  # position of the change in force, -1: the configured weights
        self.correction = [0.0] * sources
        self.weights: list[float] = []
        self._until: int | None = None
        self._reweigh()

    # -- weights in force ----------------------------------------------------------------------
    @property
    def clock(self) -> int:
        """The global sample clock of the next pick."""
        return self.picks * self.num_streams + self.stream

    def _function(self) -> WeightFunction:
        if self.regime < 0:
            return self.base
        change = next(c for c in self.changes if c.position == self.regime)
        return change.weights if change.weights is not None else self.base

    def _reweigh(self) -> None:
        """Set the weights in force at the next pick (and when to look again)."""
        t = self.clock
        function = self._function()
        raw = [w if p else 0.0 for w, p in zip(function.weights_at(t), self.present)]
        total = sum(raw)
        if total <= 0:
            raise ValueError(
                f"at global sample {t}, every source with a positive weight is empty in logical "
                f"stream {self.stream}"
            )
        weights = [w / total for w in raw]
        if self.weights:
            for i, (old, new) in enumerate(zip(self.weights, weights)):
                if old != new:
                    self.correction[i] += (old - new) * self.picks
        self.weights = weights
        self._until = function.stable_until(t)

    @property
    def change_items(self) -> list[int]:
        """The item numbers of this stream at which online weight changes take effect."""
        return list(self._change_items)

    def begin_item(self, item: int) -> None:
        """The stream is about to make its item number ``item``: apply the changes that start
        there (the latest change whose first item is ``item`` or earlier is in force)."""
        index = bisect.bisect_right(self._change_items, item) - 1
        position = self.changes[index].position if index >= 0 else -1
        if position != self.regime:
            self.regime = position
            self._reweigh()

    def expected(self) -> list[float]:
        """Per source, the sum of its normalised weight over all picks so far (its target count)."""
        return [c + w * self.picks for c, w in zip(self.correction, self.weights)]

    # -- picking -------------------------------------------------------------------------------
    def next(self) -> int:
        t = self.picks + 1
        best, best_deficit = -1, float("-inf")
        weights, phases, counts = self.weights, self.phases, self.counts
        if self.dynamic:
            correction = self.correction
            for i, w in enumerate(weights):
                if w <= 0:
                    continue
                deficit = w * (t + phases[i]) - counts[i] + correction[i]
                if deficit > best_deficit:
                    best, best_deficit = i, deficit
        else:
            for i, w in enumerate(weights):
                if w <= 0:
                    continue
                deficit = w * (t + phases[i]) - counts[i]
                if deficit > best_deficit:
                    best, best_deficit = i, deficit
        self.picks = t
        counts[best] += 1
        if self._until is not None and t * self.num_streams + self.stream >= self._until:
            self._reweigh()
        return best

    def reset(self) -> None:
        super().reset()
        self.regime = -1
        self.correction = [0.0] * len(self.counts)
        self.weights = []
        self._reweigh()

    def state(self) -> ScheduleState:
        state: ScheduleState = {
            "picks": self.picks,
            "counts": list(self.counts),
            "expected": self.expected(),
        }
        if self.dynamic:
            state["correction"] = list(self.correction)
            state["regime"] = self.regime
        return state

    def restore(self, state: ScheduleState, where: str = "schedule") -> None:
        super().restore(state, where)
        correction = state.get("correction", [0.0] * len(self.counts))
        if not isinstance(correction, list) or len(correction) != len(self.counts):
            raise fields.bad_field(f"{where}.correction", correction, f"{len(self.counts)} numbers")
        try:
            self.correction = [float(c) for c in correction]
        except (TypeError, ValueError):
            raise fields.bad_field(f"{where}.correction", correction, "numbers") from None
        self.regime = fields.int_field(state, "regime", where, low=-1, default=-1)
        if self.regime >= 0 and all(c.position != self.regime for c in self.changes):
            raise StateError(
                f"this stream's state was saved after an online blend weight change at global "
                f"micro-batch {self.regime}, which this loader does not know: restore the loader "
                "state (it records every change) instead of a single stream's snapshot"
            )
        self.weights = []
        self._reweigh()


class SizeWeightedSchedule(WeightedSchedule):
    """Infinite mix by weight over a per-sample size (``blend_by``): weights are shares of the
    sizes picked (tokens, bytes, a cost), not of the samples.

    The weights in force come from the same places as in :class:`WeightedSchedule` (fixed, a
    schedule of the global sample clock, online changes). Whoever picks must tell the size of the
    sample it read for each pick with :meth:`record` before the next pick.

    The rule: after each pick of size ``s`` at which weights ``w`` were in force, every source's
    target grows by ``w_i * s`` and the picked source's size by ``s``; pick the source ``i`` with
    ``w_i > 0`` and the largest deficit ``target_i - size_i``; ties (at the start: all are 0) go
    to the largest ``phase_i * w_i``, then to the first, so streams do not start in lock-step.
    The deficits sum to zero, the picked one is never negative before its pick, so every source
    stays within ``(n - 1) * s_max`` of its target (``n`` sources, ``s_max`` the largest size):
    over a stretch of picks whose sizes add up to ``W``, a source's share of the size is within
    ``n * s_max / W`` of its weight. State: picks and sizes per source, and the targets.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sources = len(self.counts)
        self.sizes = [0.0] * sources
        self.targets = [0.0] * sources
        self._pending: tuple[int, list[float]] | None = None  # (source, weights) of the last pick

    def expected(self) -> list[float]:
        """Per source, the size it should have been picked for so far (its target)."""
        return list(self.targets)

    def next(self) -> int:
        if self._pending is not None:
            raise RuntimeError("record() the size of the last pick before the next one")
        best, best_deficit, best_phase = -1, float("-inf"), 0.0
        weights, phases, sizes, targets = self.weights, self.phases, self.sizes, self.targets
        for i, w in enumerate(weights):
            if w <= 0:
                continue
            deficit = targets[i] - sizes[i]
            if deficit > best_deficit or (deficit == best_deficit and phases[i] * w > best_phase):
                best, best_deficit, best_phase = i, deficit, phases[i] * w
        self._pending = (best, weights)
        self.picks += 1
        self.counts[best] += 1
        if self._until is not None and self.clock >= self._until:
            self._reweigh()
        return best

    def record(self, size: float) -> None:
        """The size of the sample the last pick read."""
        if self._pending is None:
            raise RuntimeError("record() follows a pick")
        source, weights = self._pending
        self._pending = None
        targets = self.targets
        for i, w in enumerate(weights):
            targets[i] += w * size
        self.sizes[source] += size

    def reset(self) -> None:
        super().reset()
        self.sizes = [0.0] * len(self.counts)
        self.targets = [0.0] * len(self.counts)
        self._pending = None

    def state(self) -> ScheduleState:
        state: ScheduleState = {
            "picks": self.picks,
            "counts": list(self.counts),
            "sizes": list(self.sizes),
            "expected": list(self.targets),
        }
        if self.changes:
            state["regime"] = self.regime
        return state

    def restore(self, state: ScheduleState, where: str = "schedule") -> None:
        if "sizes" not in state:
            raise StateError(
                f"{where}: this stream's blend was saved weighted by samples; it is now weighted "
                "by size (blend_by): the state does not fit this configuration"
            )
        _DeficitCounts.restore(self, state, where)
        self.sizes = _numbers(state, "sizes", len(self.counts), where)
        self.targets = _numbers(state, "expected", len(self.counts), where)
        self.regime = fields.int_field(state, "regime", where, low=-1, default=-1)
        if self.regime >= 0 and all(c.position != self.regime for c in self.changes):
            raise StateError(
                f"this stream's state was saved after an online blend weight change at global "
                f"micro-batch {self.regime}, which this loader does not know: restore the loader "
                "state (it records every change) instead of a single stream's snapshot"
            )
        self._pending = None
        self.weights = []
        self._reweigh()


def _numbers(state: ScheduleState, name: str, count: int, where: str) -> list[float]:
    """A list of ``count`` finite numbers >= 0 from a saved schedule state."""
    values = state.get(name)  # type: ignore[misc]
    if not isinstance(values, list) or len(values) != count:
        raise fields.bad_field(f"{where}.{name}", values, f"{count} numbers")
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fields.bad_field(f"{where}.{name}[{i}]", value, "a number")
        if not (math.isfinite(value) and value >= 0):
            raise fields.bad_field(f"{where}.{name}[{i}]", value, "a finite number >= 0")
        out.append(float(value))
    return out


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
