"""Blend weights that change over training: weight schedules and the mixture they form.

Time is the **global sample clock**: a number of samples of the whole job, counted over all ranks.
Pick ``k`` of logical stream ``s`` (of ``L``) happens at clock ``k * L + s``; every stream picks at
the same rate, so this is the global sample index of that pick give or take one round of
micro-batches (``L * micro_batch_size`` samples), and it depends neither on the number of ranks or
workers nor on the global batch size. Schedules written in training steps are converted once, when
the config is resolved (step ``n`` is sample ``n * global_batch_size``).

A :class:`WeightSchedule` is a piecewise function of the clock through given points: held
(``step``), interpolated linearly (``linear``, ``piecewise_linear``) or along a half cosine
(``cosine``); before the first point it has the first value, after the last point the last value.
Between two points a linear or cosine schedule moves in at most :data:`SEGMENT_STEPS` equal steps
(of ``ceil(span / SEGMENT_STEPS)`` samples), so a stream re-evaluates its weights at most that often
per piece instead of at every pick. The arithmetic uses only integer operations and ``+ - * /``,
``min``/``max`` on IEEE doubles (the cosine is a fixed polynomial, not the platform's libm), so every
machine, and a C loop that does the same operations in the same order, computes the same bits.
``docs/metadatasets.md`` spells the formulas out.

A :class:`Mixture` is the blend tree of a metadataset as weight functions: a source's weight at
time ``t`` is the product, over the blends above it, of its entry's value divided by the sum of
that blend's entries (weights are normalised per blend and multiply through nesting, as for fixed
weights). :class:`FlatWeights` is one schedule per source, without nesting (fixed weights and the
weights set online by ``loader.set_blend_weights``). Both are :class:`WeightFunction`\\ s.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

UNITS = ("samples", "steps")
# a linear or cosine piece moves in at most this many equal steps of whole samples (its value is
# that of the start of the step): schedules are re-evaluated rarely, at a cost of < 0.1% of the
# piece's change in precision
SEGMENT_STEPS = 1024
KINDS = ("constant", "step", "linear", "cosine", "piecewise_linear")
_INTERPOLATION = {
    "constant": "hold",
    "step": "hold",
    "linear": "linear",
    "piecewise_linear": "linear",
    "cosine": "cosine",
}

# sin(z) = z * (1 + z^2 * (S1 + z^2 * (S2 + ...))), |z| <= pi/2: the doubles nearest to
# (-1)^k / (2k + 1)!, k = 1..10 (the next term is below 3e-16)
_SIN_COEFFICIENTS = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 11))


def half_cosine(x: float) -> float:
    """``(1 + cos(pi * x)) / 2`` for ``x`` in [0, 1] (1 at 0, 0 at 1), from a fixed polynomial:
    ``z = pi * (x - 0.5)``, ``h = (1 - sin(z)) / 2`` with the Taylor series of ``sin`` evaluated by
    Horner's rule from the highest coefficient, clamped to [0, 1]."""
    z = math.pi * (x - 0.5)
    z2 = z * z
    acc = 0.0
    for coefficient in reversed(_SIN_COEFFICIENTS):
        acc = (acc + coefficient) * z2
    sine = z * (1.0 + acc)
    return min(1.0, max(0.0, (1.0 - sine) / 2.0))


@dataclasses.dataclass(frozen=True)
class WeightSchedule:
    """A blend weight as a function of the global sample clock (or of training steps, until
    :meth:`in_samples` converts it).

    ``points`` are ``(time, weight)`` with strictly increasing integer times >= 0 and weights >= 0;
    ``kind`` is how the schedule was written (one of :data:`KINDS`) and fixes the interpolation
    between points. Build one with the class methods; all of them take ``unit="samples"`` (default)
    or ``unit="steps"``.
    """

    kind: str
    points: tuple[tuple[int, float], ...]
    unit: str = "samples"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown weight schedule {self.kind!r}; one of {', '.join(KINDS)}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be 'samples' or 'steps', got {self.unit!r}")
        if not self.points:
            raise ValueError("a weight schedule needs at least one point")
        last = -1
        for time, weight in self.points:
            if isinstance(time, bool) or not isinstance(time, int) or time < 0:
                raise ValueError(f"times must be integers >= 0, got {time!r}")
            if time <= last:
                raise ValueError(f"times must increase strictly, got {time} after {last}")
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not weight >= 0
                or math.isinf(weight)
            ):
                raise ValueError(f"weights must be finite numbers >= 0, got {weight!r}")
            last = time
        object.__setattr__(self, "points", tuple((int(t), float(w)) for t, w in self.points))
        object.__setattr__(self, "_times", [t for t, _ in self.points])
        object.__setattr__(self, "_values", [w for _, w in self.points])

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def constant(cls, weight: float) -> WeightSchedule:
        return cls("constant", ((0, weight),))

    @classmethod
    def step(cls, points: Sequence[tuple[int, float]], *, unit: str = "samples") -> WeightSchedule:
        """``weight_i`` from ``time_i`` until the next point's time (piecewise constant)."""
        return cls("step", tuple((t, w) for t, w in points), unit)

    @classmethod
    def linear(
        cls, start: int, end: int, from_weight: float, to_weight: float, *, unit: str = "samples"
    ) -> WeightSchedule:
        """``from_weight`` until ``start``, a straight line to ``to_weight`` at ``end``, then flat."""
        return cls("linear", ((start, from_weight), (end, to_weight)), unit)

    @classmethod
    def cosine(
        cls, start: int, end: int, from_weight: float, to_weight: float, *, unit: str = "samples"
    ) -> WeightSchedule:
        """Like :meth:`linear`, along a half cosine (flat at both ends)."""
        return cls("cosine", ((start, from_weight), (end, to_weight)), unit)

    @classmethod
    def piecewise_linear(
        cls, points: Sequence[tuple[int, float]], *, unit: str = "samples"
    ) -> WeightSchedule:
        """Straight lines through the points; flat before the first and after the last."""
        return cls("piecewise_linear", tuple((t, w) for t, w in points), unit)

    # -- values --------------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        values = self._values  # type: ignore[attr-defined]
        return all(v == values[0] for v in values)

    def in_samples(self, global_batch_size: int | None) -> WeightSchedule:
        """The same schedule on the sample clock (step ``n`` is sample ``n * global_batch_size``)."""
        if self.unit == "samples":
            return self
        if global_batch_size is None:
            raise ValueError("a schedule in steps needs a global batch size")
        points = tuple((t * global_batch_size, w) for t, w in self.points)
        return WeightSchedule(self.kind, points, "samples")

    def value_at(self, t: int) -> float:
        """The weight at clock ``t``."""
        times: list[int] = self._times  # type: ignore[attr-defined]
        values: list[float] = self._values  # type: ignore[attr-defined]
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return values[0]
        if i >= len(times) - 1:
            return values[-1]
        interpolation = _INTERPOLATION[self.kind]
        if interpolation == "hold":
            return values[i]
        span = times[i + 1] - times[i]
        quantum = -(-span // SEGMENT_STEPS)
        x = (t - times[i]) // quantum * quantum / span
        if interpolation == "linear":
            return values[i] + (values[i + 1] - values[i]) * x
        return values[i + 1] + (values[i] - values[i + 1]) * half_cosine(x)

    def stable_until(self, t: int) -> int | None:
        """The first clock after ``t`` at which the value may differ from ``value_at(t)`` (None:
        never). Callers may skip re-evaluating until then."""
        times: list[int] = self._times  # type: ignore[attr-defined]
        values: list[float] = self._values  # type: ignore[attr-defined]
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return times[0]
        if i >= len(times) - 1:
            return None
        if _INTERPOLATION[self.kind] == "hold" or values[i] == values[i + 1]:
            return times[i + 1]
        quantum = -(-(times[i + 1] - times[i]) // SEGMENT_STEPS)
        return min(times[i + 1], times[i] + ((t - times[i]) // quantum + 1) * quantum)

    def breakpoints(self) -> list[int]:
        return list(self._times)  # type: ignore[attr-defined]

    def mean(self, start: int, end: int) -> float:
        """Mean value over the clocks ``start <= t < end`` (exact sum; for reports and tests)."""
        return sum(self.value_at(t) for t in range(start, end)) / max(1, end - start)

    # -- plain data ----------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "points": [list(p) for p in self.points], "unit": self.unit}

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> WeightSchedule:
        return cls(data["kind"], tuple((int(t), float(w)) for t, w in data["points"]), data["unit"])

    def describe(self) -> str:
        if self.kind == "constant":
            return f"{self._values[0]:g}"  # type: ignore[attr-defined]
        points = ", ".join(f"{t}: {w:g}" for t, w in self.points)
        return f"{self.kind}({points} {self.unit})"


class WeightFunction(Protocol):
    """Raw (not yet normalised) weights of every source of a blend at a clock."""

    def weights_at(self, t: int) -> list[float]: ...

    def stable_until(self, t: int) -> int | None:
        """First clock after ``t`` at which ``weights_at`` may change (None: never)."""
        ...

    def check_times(self) -> list[int]:
        """Clocks at which checking ``weights_at`` covers every value it can take a zero at."""
        ...


def _stable_until(schedules: Sequence[WeightSchedule], t: int) -> int | None:
    until = None
    for schedule in schedules:
        u = schedule.stable_until(t)
        if u is not None and (until is None or u < until):
            until = u
    return until


def _check_times(schedules: Sequence[WeightSchedule]) -> list[int]:
    """Every breakpoint, one clock inside every gap between breakpoints, and one after the last.

    Each schedule is monotone (or constant) between its breakpoints, so where a sum of them is
    zero somewhere it is also zero at one of these clocks.
    """
    times = sorted({0, *(t for s in schedules for t in s.breakpoints())})
    inside = [(a + b) // 2 for a, b in zip(times, times[1:]) if b - a > 1]
    return sorted({*times, *inside, times[-1] + 1})


@dataclasses.dataclass(frozen=True)
class FlatWeights:
    """One schedule per source, not nested."""

    schedules: tuple[WeightSchedule, ...]

    @classmethod
    def constant(cls, weights: Sequence[float]) -> FlatWeights:
        return cls(tuple(WeightSchedule.constant(float(w)) for w in weights))

    def weights_at(self, t: int) -> list[float]:
        return [s.value_at(t) for s in self.schedules]

    def stable_until(self, t: int) -> int | None:
        return _stable_until(self.schedules, t)

    def check_times(self) -> list[int]:
        return _check_times(self.schedules)

    def config(self) -> list[dict[str, Any]]:
        return [s.config() for s in self.schedules]

    @classmethod
    def from_config(cls, data: list[dict[str, Any]]) -> FlatWeights:
        return cls(tuple(WeightSchedule.from_config(d) for d in data))


@dataclasses.dataclass(frozen=True)
class Mixture:
    """The weight schedules of a metadataset's blend tree.

    ``levels[g]`` holds the schedules of blend ``g``'s entries; ``paths[i]`` lists, from the
    outermost blend in, the ``(blend, entry)`` pairs above source ``i``. The weight of source ``i``
    at ``t`` is the product over its path of ``value(entry) / sum(values of the blend's entries)``
    (a factor is 0 where its blend's entries are all 0).
    """

    levels: tuple[tuple[WeightSchedule, ...], ...]
    paths: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def is_constant(self) -> bool:
        return all(s.is_constant for level in self.levels for s in level)

    def weights_at(self, t: int) -> list[float]:
        factors = []
        for level in self.levels:
            values = [s.value_at(t) for s in level]
            total = sum(values)
            factors.append([v / total if total > 0 else 0.0 for v in values])
        out = []
        for path in self.paths:
            weight = 1.0
            for g, e in path:
                weight *= factors[g][e]
            out.append(weight)
        return out

    def stable_until(self, t: int) -> int | None:
        return _stable_until([s for level in self.levels for s in level], t)

    def check_times(self) -> list[int]:
        return _check_times([s for level in self.levels for s in level])

    def config(self) -> dict[str, Any]:
        return {
            "levels": [[s.config() for s in level] for level in self.levels],
            "paths": [[list(step) for step in path] for path in self.paths],
        }


@dataclasses.dataclass(frozen=True)
class WeightChange:
    """A change of a blend's weights made online (``loader.set_blend_weights``).

    From global micro-batch ``position`` on, the blend follows ``weights`` (one schedule per source,
    on the sample clock; not nested), or its configured schedule again when ``weights`` is None.
    Logical stream ``s`` switches right before it makes its item number :meth:`first_item`, i.e.
    the first of its items at a global position >= ``position``.
    """

    position: int
    weights: FlatWeights | None

    def first_item(self, stream: int, num_streams: int) -> int:
        return max(0, -(-(self.position - stream) // num_streams))

    def config(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "weights": None if self.weights is None else self.weights.config(),
        }

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> WeightChange:
        weights = data.get("weights")
        return cls(
            int(data["position"]), None if weights is None else FlatWeights.from_config(weights)
        )
