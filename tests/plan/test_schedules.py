"""Weight schedules and scheduled blends: values, exact integral tracking, restore anywhere, online
changes at item boundaries, and the per-window proportions of the global clock."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.plan.mixing import WeightedSchedule
from energon.plan.schedules import (
    SEGMENT_STEPS,
    FlatWeights,
    Mixture,
    WeightChange,
    WeightSchedule,
    half_cosine,
)

FAST = settings(max_examples=40, deadline=None)


def flat(*schedules):
    return FlatWeights(tuple(schedules))


# -- single schedules ---------------------------------------------------------------------------


def test_schedule_values_at_known_points():
    step = WeightSchedule.step([(0, 1.0), (100, 0.5), (250, 0.0)])
    assert [step.value_at(t) for t in (0, 99, 100, 249, 250, 10**9)] == [1, 1, 0.5, 0.5, 0, 0]
    linear = WeightSchedule.linear(1000, 2024, 2.0, 0.0)  # span 1024: one step per sample
    assert linear.value_at(0) == 2.0 and linear.value_at(999) == 2.0
    assert linear.value_at(1512) == 1.0 and linear.value_at(2024) == 0.0
    assert linear.value_at(1256) == 2.0 + (0.0 - 2.0) * (256 / 1024)
    cosine = WeightSchedule.cosine(0, 1024, 1.0, 0.0)
    assert cosine.value_at(0) == 1.0 and cosine.value_at(1024) == 0.0
    assert cosine.value_at(512) == pytest.approx(0.5, abs=1e-15)
    assert cosine.value_at(256) == pytest.approx((1 + math.cos(math.pi / 4)) / 2, abs=1e-14)
    pwl = WeightSchedule.piecewise_linear([(10, 0.0), (20, 1.0), (40, 0.0)])
    assert [pwl.value_at(t) for t in (0, 10, 15, 20, 30, 40, 50)] == [0, 0, 0.5, 1, 0.5, 0, 0]


def test_long_pieces_move_in_at_most_segment_steps_steps():
    schedule = WeightSchedule.linear(0, 100 * SEGMENT_STEPS, 0.0, 1.0)
    values = {schedule.value_at(t) for t in range(0, 100 * SEGMENT_STEPS, 7)}
    assert len(values) == SEGMENT_STEPS
    assert schedule.value_at(99) == 0.0 and schedule.value_at(100) == 1 / SEGMENT_STEPS
    # the quantisation costs less than one step of the piece's change
    for t in range(0, 100 * SEGMENT_STEPS, 997):
        assert abs(schedule.value_at(t) - t / (100 * SEGMENT_STEPS)) <= 1 / SEGMENT_STEPS


def test_half_cosine_is_a_fixed_polynomial_close_to_cos():
    for i in range(0, 10001):
        x = i / 10000
        assert abs(half_cosine(x) - (1 + math.cos(math.pi * x)) / 2) < 1e-15
    assert half_cosine(0.0) == 1.0 and half_cosine(1.0) == 0.0


schedules = st.one_of(
    st.builds(
        lambda a, b, s, d: WeightSchedule.linear(s, s + d, a, b),
        st.floats(0, 3),
        st.floats(0, 3),
        st.integers(0, 5000),
        st.integers(1, 20000),
    ),
    st.builds(
        lambda a, b, s, d: WeightSchedule.cosine(s, s + d, a, b),
        st.floats(0, 3),
        st.floats(0, 3),
        st.integers(0, 5000),
        st.integers(1, 20000),
    ),
    st.lists(st.tuples(st.integers(0, 20000), st.floats(0, 3)), min_size=1, max_size=5).map(
        lambda pts: WeightSchedule.step(sorted(dict(pts).items()))
    ),
    st.lists(st.tuples(st.integers(0, 20000), st.floats(0, 3)), min_size=1, max_size=5).map(
        lambda pts: WeightSchedule.piecewise_linear(sorted(dict(pts).items()))
    ),
    st.floats(0.01, 3).map(WeightSchedule.constant),
)


@FAST
@given(schedule=schedules, t=st.integers(0, 30000), data=st.data())
def test_stable_until_promises_an_unchanged_value(schedule, t, data):
    until = schedule.stable_until(t)
    later = data.draw(st.integers(t, t + 40000 if until is None else until - 1))
    assert schedule.value_at(later) == schedule.value_at(t)
    assert schedule.value_at(t) >= 0


def test_steps_convert_with_the_global_batch_size():
    schedule = WeightSchedule.linear(10, 20, 1.0, 0.0, unit="steps")
    assert schedule.in_samples(64) == WeightSchedule.linear(640, 1280, 1.0, 0.0)
    with pytest.raises(ValueError, match="global batch size"):
        schedule.in_samples(None)
    with pytest.raises(ValueError, match="increase strictly"):
        WeightSchedule.step([(5, 1.0), (5, 2.0)])
    with pytest.raises(ValueError, match=">= 0"):
        WeightSchedule.step([(0, -1.0)])


def test_nested_schedules_multiply():
    outer = (WeightSchedule.linear(0, 1000, 1.0, 3.0), WeightSchedule.constant(1.0))
    inner = (WeightSchedule.constant(1.0), WeightSchedule.step([(0, 1.0), (500, 3.0)]))
    # sources: inner[0] and inner[1] under outer[0]; a leaf under outer[1]
    mixture = Mixture((outer, inner), (((0, 0), (1, 0)), ((0, 0), (1, 1)), ((0, 1),)))
    for t in (0, 250, 499, 500, 750, 5000):
        o = [s.value_at(t) for s in outer]
        i = [s.value_at(t) for s in inner]
        expected = [
            o[0] / sum(o) * i[0] / sum(i),
            o[0] / sum(o) * i[1] / sum(i),
            o[1] / sum(o),
        ]
        assert mixture.weights_at(t) == pytest.approx(expected, abs=1e-15)
        assert sum(mixture.weights_at(t)) == pytest.approx(1.0)


# -- scheduled blends ---------------------------------------------------------------------------


def _normalised(function, t):
    raw = function.weights_at(t)
    return [w / sum(raw) for w in raw]


@FAST
@given(
    pair=st.lists(schedules, min_size=2, max_size=4),
    num_streams=st.integers(1, 8),
    data=st.data(),
)
def test_picks_follow_the_integral_of_the_weights(pair, num_streams, data):
    """At every pick, each source's count is within a pick or two of the sum of its normalised
    weight over the picks so far (evaluated at the global clock of each pick)."""
    function = flat(*pair, WeightSchedule.constant(0.05))  # never all zero
    stream = data.draw(st.integers(0, num_streams - 1))
    phases = data.draw(st.lists(st.floats(0, 0.999), min_size=4 + 1, max_size=4 + 1))
    phases = phases[: len(function.schedules)]
    schedule = WeightedSchedule(function, phases, stream=stream, num_streams=num_streams)
    target = [0.0] * len(phases)
    for k in range(3000 // num_streams + 50):
        weights = _normalised(function, k * num_streams + stream)
        assert schedule.weights == weights
        source = schedule.next()
        assert weights[source] > 0
        target = [a + w for a, w in zip(target, weights)]
        assert schedule.expected() == pytest.approx(target, abs=1e-9)
        for count, goal in zip(schedule.counts, target):
            assert abs(count - goal) < len(phases), (k, schedule.counts, target)


def _run(schedule, n, items_of=None):
    picks = []
    for k in range(n):
        if items_of is not None and k % items_of == 0:
            schedule.begin_item(k // items_of)
        picks.append(schedule.next())
    return picks


@FAST
@given(
    pair=st.lists(schedules, min_size=2, max_size=3),
    num_streams=st.integers(1, 6),
    changes=st.lists(st.integers(0, 400), max_size=3, unique=True),
    data=st.data(),
)
def test_scheduled_blend_resumes_anywhere_from_its_json_state(pair, num_streams, changes, data):
    """Schedules x layouts x interrupt points x online changes: a schedule rebuilt from the
    JSON state continues exactly."""
    function = flat(*pair, WeightSchedule.constant(0.1))
    n = len(function.schedules)
    stream = data.draw(st.integers(0, num_streams - 1))
    phases = [0.3, 0.7, 0.1, 0.9][:n]
    weight_changes = [
        WeightChange(p, flat(*[WeightSchedule.constant(float((i + p) % 3 + 1)) for i in range(n)]))
        for p in changes
    ]
    if weight_changes:  # a change back to the configured weights
        weight_changes.append(WeightChange(max(changes) + 37, None))

    def make():
        return WeightedSchedule(
            function, phases, stream=stream, num_streams=num_streams, changes=weight_changes
        )

    items_of = 4  # a stream makes an item of 4 samples
    total = 1200
    reference = _run(make(), total, items_of)
    split = data.draw(st.integers(0, total))
    first = make()
    head = _run(first, split, items_of)
    state = json.loads(json.dumps(first.state()))
    second = make()
    second.restore(state)
    tail = []
    for k in range(split, total):
        if k % items_of == 0:
            second.begin_item(k // items_of)
        tail.append(second.next())
    assert head + tail == reference


def test_online_changes_start_at_the_first_item_at_or_after_their_position():
    change = WeightChange(10, flat(WeightSchedule.constant(0.0), WeightSchedule.constant(1.0)))
    # positions of stream s's items: s, s + 4, s + 8, s + 12: stream 1 switches before item 3
    assert [change.first_item(s, 4) for s in range(4)] == [3, 3, 2, 2]
    assert WeightChange(0, None).first_item(3, 4) == 0
    schedule = WeightedSchedule(
        flat(WeightSchedule.constant(1.0), WeightSchedule.constant(0.0)),
        stream=1,
        num_streams=4,
        changes=[change],
    )
    picks = _run(schedule, 20, items_of=2)  # items of 2 picks: item 3 starts at pick 6
    assert picks == [0] * 6 + [1] * 14
    assert schedule.state()["regime"] == 10
    assert schedule.expected() == [6.0, 14.0]


def test_restoring_a_state_with_an_unknown_change_is_an_error():
    schedule = WeightedSchedule([1.0, 1.0], changes=[WeightChange(0, None)])
    schedule.begin_item(0)
    state = schedule.state()
    with pytest.raises(ValueError, match="does not know"):
        WeightedSchedule([1.0, 1.0]).restore(state)


def test_fixed_weights_keep_the_original_rule_bit_for_bit():
    """The general rule with no changes is the plain largest-deficit rule that fixed-weight blends
    always used (saved runs continue identically)."""
    weights, phases = [0.2, 0.3, 0.5], [0.25, 0.5, 0.75]
    schedule = WeightedSchedule(weights, phases, stream=2, num_streams=5)
    counts = [0, 0, 0]
    for t in range(1, 5000):
        deficits = [w * (t + p) - c for w, p, c in zip(weights, phases, counts)]
        best = deficits.index(max(deficits))
        counts[best] += 1
        assert schedule.next() == best
    assert not schedule.dynamic and "correction" not in schedule.state()


@pytest.mark.parametrize("num_streams", [1, 4, 16])
@pytest.mark.parametrize(
    "shape",
    [
        (WeightSchedule.linear(0, 20000, 0.0, 1.0), WeightSchedule.constant(0.5)),
        (
            WeightSchedule.step([(0, 1.0), (7000, 0.1), (13000, 3.0)]),
            WeightSchedule.constant(1.0),
        ),
        (WeightSchedule.cosine(2000, 18000, 2.0, 0.2), WeightSchedule.linear(0, 20000, 0.1, 1)),
    ],
    ids=["linear", "step", "cosine"],
)
def test_every_window_of_the_global_clock_matches_the_schedule(shape, num_streams):
    """All streams together, in global clock order: in every window of 1,000 samples each
    source's share is within 2% of the schedule's mean weight over the window."""
    function = flat(*shape)
    total = 24000
    by_clock = [0] * total
    for stream in range(num_streams):
        schedule = WeightedSchedule(function, [0.37, 0.61], stream=stream, num_streams=num_streams)
        for k in range(-(-(total - stream) // num_streams)):
            by_clock[k * num_streams + stream] = schedule.next()
    shares = [_normalised(function, t)[0] for t in range(total)]
    for start in range(0, total - 999, 250):
        observed = by_clock[start : start + 1000].count(0)
        requested = sum(shares[start : start + 1000])
        assert abs(observed - requested) <= 20, (start, observed, requested)
