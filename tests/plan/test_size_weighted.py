"""Blends weighted by a per-sample size (``blend_by``): the size shares of every window, the bound
behind them, exact resume from the JSON state, weight schedules and online changes."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.errors import StateError
from energon.plan.mixing import Schedule, SizeWeightedSchedule, WeightedSchedule
from energon.plan.schedules import FlatWeights, WeightChange, WeightSchedule

FAST = settings(max_examples=40, deadline=None)

weights_strategy = st.lists(
    st.one_of(st.just(0.0), st.floats(0.02, 1.0), st.just(1.0)), min_size=1, max_size=5
).filter(lambda w: sum(w) > 0)


class Sizes:
    """Per source, a reproducible stream of sample sizes in [low, high] (sources differ a lot:
    short captions next to long documents)."""

    def __init__(self, sources: int, seed: int) -> None:
        rng = random.Random(seed)
        self.ranges = []
        for _ in range(sources):
            low = rng.choice([1, 5, 50, 400])
            self.ranges.append((low, low * rng.choice([1, 3, 10])))
        self.rngs = [random.Random(seed * 31 + i) for i in range(sources)]

    @property
    def largest(self) -> int:
        return max(high for _, high in self.ranges)

    def draw(self, source: int) -> int:
        low, high = self.ranges[source]
        return self.rngs[source].randint(low, high)


def run(schedule: SizeWeightedSchedule, sizes: Sizes, n: int) -> list[tuple[int, int]]:
    """``n`` picks: (source, size) each, the size recorded as a pointer source does."""
    out = []
    for _ in range(n):
        source = schedule.next()
        size = sizes.draw(source)
        schedule.record(size)
        out.append((source, size))
    return out


@FAST
@given(weights=weights_strategy, seed=st.integers(0, 10_000), data=st.data())
def test_every_window_holds_each_source_within_one_percent_of_its_weight(weights, seed, data):
    """Every stretch of picks whose sizes add up to at least 100 * n * s_max: each source's share
    of the size is within 1% of its weight (the bound n * s_max / W of the docstring)."""
    phases = data.draw(st.lists(st.floats(0, 0.999), min_size=len(weights), max_size=len(weights)))
    shares = [w / sum(weights) for w in weights]
    sizes = Sizes(len(weights), seed)
    picks = run(SizeWeightedSchedule(weights, phases), sizes, 3000)
    assert all(weights[source] > 0 for source, _ in picks), "zero weights are never picked"
    n = len(weights)
    prefix = [[0.0] * n]
    for source, size in picks:
        row = list(prefix[-1])
        row[source] += size
        prefix.append(row)
    for t in range(len(prefix)):  # the bound itself, at every prefix
        total = sum(prefix[t])
        for i in range(n):
            assert abs(prefix[t][i] - shares[i] * total) <= (n - 1) * sizes.largest + 1e-6
    minimum = 100 * n * sizes.largest
    totals = [sum(row) for row in prefix]
    windows = 0
    pairs = [(a, b) for a in range(0, len(prefix), 37) for b in range(a + 1, len(prefix), 53)]
    for a, b in [*pairs, (0, len(prefix) - 1)]:
        width = totals[b] - totals[a]
        if width < minimum:
            continue
        windows += 1
        for i in range(n):
            assert abs((prefix[b][i] - prefix[a][i]) / width - shares[i]) <= 0.01
    assert windows or totals[-1] < minimum


def test_equal_weights_share_size_not_samples():
    """Long documents against short captions at 50/50: the captions are picked ten times as often."""
    schedule = SizeWeightedSchedule([1.0, 1.0])
    for _ in range(11_000):
        source = schedule.next()
        schedule.record(1000.0 if source == 0 else 100.0)
    assert schedule.sizes[0] == pytest.approx(schedule.sizes[1], rel=1e-3)
    assert schedule.counts[1] == pytest.approx(10 * schedule.counts[0], rel=1e-2)
    assert schedule.expected() == pytest.approx([sum(schedule.sizes) / 2] * 2)


@FAST
@given(weights=weights_strategy, seed=st.integers(0, 1000), split=st.integers(0, 300))
def test_resumes_exactly_from_its_json_state(weights, seed, split):
    phases = [0.5] * len(weights)
    reference = run(SizeWeightedSchedule(weights, phases), Sizes(len(weights), seed), 300)
    sizes = Sizes(len(weights), seed)
    first = SizeWeightedSchedule(weights, phases)
    head = run(first, sizes, split)
    second = SizeWeightedSchedule(weights, phases)
    second.restore(json.loads(json.dumps(first.state())))
    assert second.state() == first.state()
    assert head + run(second, sizes, 300 - split) == reference


def flat(*schedules: WeightSchedule) -> FlatWeights:
    return FlatWeights(tuple(schedules))


def test_scheduled_and_changed_weights_move_the_targets_by_the_size_at_each_pick():
    """The target of each source is the sum over picks of (its weight in force) x (the size
    picked): weight schedules on the sample clock and online changes at item boundaries."""
    function = flat(WeightSchedule.linear(200, 1200, 1.0, 0.2), WeightSchedule.constant(1.0))
    change = WeightChange(600, flat(WeightSchedule.constant(3.0), WeightSchedule.constant(1.0)))
    back = WeightChange(900, None)
    stream, L = 1, 3

    def make():
        return SizeWeightedSchedule(
            function, [0.2, 0.8], stream=stream, num_streams=L, changes=[change, back]
        )

    schedule, sizes = make(), Sizes(2, 7)
    target = [0.0, 0.0]
    log = []
    for k in range(1500):
        if k % 2 == 0:  # items of two picks
            schedule.begin_item(k // 2)
        item = k // 2
        clock = k * L + stream
        if change.first_item(stream, L) <= item < back.first_item(stream, L):
            weights = [0.75, 0.25]
        else:
            raw = function.weights_at(clock)
            weights = [w / sum(raw) for w in raw]
        assert schedule.weights == pytest.approx(weights)
        source = schedule.next()
        size = sizes.draw(source)
        schedule.record(size)
        log.append((source, size))
        target = [t + w * size for t, w in zip(target, weights)]
        assert schedule.expected() == pytest.approx(target)
        for picked, goal in zip(schedule.sizes, target):
            assert abs(picked - goal) <= sizes.largest + 1e-6
    # and it resumes across the changes
    for split in (0, 450, 601 * 2, 1499):
        first, sizes = make(), Sizes(2, 7)
        head = []
        for k in range(split):
            if k % 2 == 0:
                first.begin_item(k // 2)
            head.append((first.next(), None))
            size = sizes.draw(head[-1][0])
            first.record(size)
            head[-1] = (head[-1][0], size)
        second = make()
        second.restore(json.loads(json.dumps(first.state())))
        tail = []
        for k in range(split, 1500):
            if k % 2 == 0:
                second.begin_item(k // 2)
            source = second.next()
            size = sizes.draw(source)
            second.record(size)
            tail.append((source, size))
        assert head + tail == log


def test_protocol_and_misuse():
    schedule = SizeWeightedSchedule([1.0, 2.0])
    assert isinstance(schedule, Schedule) and not schedule.finite
    schedule.next()
    with pytest.raises(RuntimeError, match="record"):
        schedule.next()
    schedule.record(3.0)
    with pytest.raises(RuntimeError, match="follows a pick"):
        schedule.record(3.0)
    by_samples = WeightedSchedule([1.0, 2.0])
    by_samples.next()
    with pytest.raises(StateError, match="weighted by samples"):
        SizeWeightedSchedule([1.0, 2.0]).restore(by_samples.state())
    bad = schedule.state()
    bad["sizes"] = [1.0, float("nan")]
    with pytest.raises(StateError, match="sizes"):
        SizeWeightedSchedule([1.0, 2.0]).restore(bad)
