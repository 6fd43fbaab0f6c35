"""Blend schedules: proportions over every window, exact quotas, state round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.plan.mixing import QuotaSchedule, Schedule, WeightedSchedule

FAST = settings(max_examples=60, deadline=None)

weights_strategy = st.lists(
    st.one_of(st.just(0.0), st.floats(1e-3, 1.0), st.just(1.0)), min_size=1, max_size=6
).filter(lambda w: sum(w) > 0)


def _picks(schedule, n):
    return [schedule.next() for _ in range(n)]


@FAST
@given(weights=weights_strategy, data=st.data())
def test_weighted_mix_matches_the_weights_in_every_prefix_and_window(weights, data):
    phase = data.draw(st.lists(st.floats(0, 0.999), min_size=len(weights), max_size=len(weights)))
    shares = [w / sum(weights) for w in weights]
    picks = _picks(WeightedSchedule(weights, phase), 400)
    prefix = [[0] * len(weights)]
    for source in picks:
        counts = list(prefix[-1])
        counts[source] += 1
        prefix.append(counts)
    for t in range(1, 401):
        for i, share in enumerate(shares):
            assert abs(prefix[t][i] - share * t) < 2
    for a in range(0, 400, 13):
        for b in range(a + 1, 401, 17):
            for i, share in enumerate(shares):
                assert abs(prefix[b][i] - prefix[a][i] - share * (b - a)) < 3
    assert all(weights[source] > 0 for source in picks), "zero weights are never picked"


def test_weighted_schedule_needs_a_positive_weight():
    with pytest.raises(ValueError, match="positive weight"):
        WeightedSchedule([0.0, 0.0])


@FAST
@given(weights=weights_strategy, data=st.data(), split=st.integers(0, 100))
def test_weighted_schedule_resumes_from_its_state(weights, data, split):
    phase = data.draw(st.lists(st.floats(0, 0.999), min_size=len(weights), max_size=len(weights)))
    reference = _picks(WeightedSchedule(weights, phase), 150)
    first = WeightedSchedule(weights, phase)
    head = _picks(first, split)
    second = WeightedSchedule(weights, phase)
    second.restore(json.loads(json.dumps(first.state())))
    assert head + _picks(second, 150 - split) == reference


@FAST
@given(quotas=st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(any))
def test_quota_schedule_picks_each_source_exactly_its_quota_interleaved(quotas):
    schedule = QuotaSchedule(quotas)
    total = sum(quotas)
    picks = _picks(schedule, total)
    assert schedule.done
    assert [picks.count(i) for i in range(len(quotas))] == quotas
    counts = [0] * len(quotas)
    for t, source in enumerate(picks, 1):
        counts[source] += 1
        for i, q in enumerate(quotas):
            assert abs(counts[i] - q * t / total) < 2
    with pytest.raises(StopIteration):
        schedule.next()
    schedule.reset()
    assert not schedule.done and _picks(schedule, total) == picks


@FAST
@given(quotas=st.lists(st.integers(0, 20), min_size=1, max_size=5).filter(any), split=st.data())
def test_quota_schedule_resumes_from_its_state(quotas, split):
    total = sum(quotas)
    k = split.draw(st.integers(0, total))
    reference = _picks(QuotaSchedule(quotas), total)
    first = QuotaSchedule(quotas)
    head = _picks(first, k)
    second = QuotaSchedule(quotas)
    second.restore(json.loads(json.dumps(first.state())))
    assert head + _picks(second, total - k) == reference


def test_both_schedules_keep_the_schedule_protocol():
    weighted, quota = WeightedSchedule([1, 2]), QuotaSchedule([1, 2])
    assert isinstance(weighted, Schedule) and isinstance(quota, Schedule)
    assert (weighted.finite, weighted.done) == (False, False)
    assert quota.finite and not quota.done
    _picks(weighted, 5)
    weighted.reset()
    assert weighted.state() == {"picks": 0, "counts": [0, 0], "expected": [0.0, 0.0]}
