"""SliceReader: the order in which one stream hands out the sample indices of one leaf."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.plan.reader import SliceReader
from energon.plan.sharding import slice_bounds

FAST = settings(max_examples=60, deadline=None)


def _bounds(num_samples=53, shard=11, max_len=4, start=0):
    shard_starts = list(range(0, start + num_samples, shard))
    return slice_bounds(start, start + num_samples, shard_starts, max_len)


def _reader(bounds=None, **kwargs):
    settings = {"seed": 3, "shuffle": True, "parallel_slices": 4}
    settings.update(kwargs)
    return SliceReader(_bounds() if bounds is None else bounds, **settings)


def _take(reader, n):
    return [reader.next() for _ in range(n)]


@pytest.mark.parametrize("parallel", [1, 4, 100])
@pytest.mark.parametrize("start", [0, 17])
def test_each_index_exactly_once_per_epoch(parallel, start):
    reader = _reader(_bounds(start=start), parallel_slices=parallel)
    for epoch in range(3):
        assert sorted(_take(reader, 53)) == list(range(start, start + 53))
        assert reader.epoch == epoch
    assert reader.yielded == 3 * 53


def test_epochs_are_shuffled_differently_and_seeds_matter():
    reader = _reader()
    first, second = _take(reader, 53), _take(reader, 53)
    assert first != second
    assert _take(_reader(seed=4), 53) != first
    assert _take(_reader(), 53) == first


def test_excluded_indices_never_come():
    excluded = frozenset({0, 5, 6, 52, 30})
    reader = _reader(excluded=excluded)
    for _ in range(2):
        epoch = _take(reader, 53 - len(excluded))
        assert sorted(epoch) == sorted(set(range(53)) - excluded)


def test_validation_reads_in_order_once():
    reader = _reader(shuffle=False, repeat=False)
    assert _take(reader, 53) == list(range(53))
    with pytest.raises(StopIteration):
        reader.next()


def test_an_empty_range_ends_at_once():
    reader = SliceReader(slice_bounds(5, 5, [0], 4), seed=0, shuffle=True)
    assert reader.num_samples == 0
    with pytest.raises(StopIteration):
        reader.next()


@pytest.mark.parametrize("over_epochs", [2, 3])
def test_shuffle_over_epochs_reads_each_index_k_times_in_k_epochs(over_epochs):
    reader = _reader(shuffle_over_epochs=over_epochs)
    for _ in range(2):  # two super-epochs
        counts = Counter(_take(reader, 53 * over_epochs))
        assert set(counts) <= set(range(53))
        # each slice is read `over_epochs` times; every index of a slice as often as the slice
        assert sorted(counts.values()) == [over_epochs] * 53


def test_sampling_slices_with_replacement_stays_in_range():
    reader = _reader(shuffle_over_epochs=-1)
    indices = _take(reader, 500)
    assert set(indices) <= set(range(53))
    assert _take(_reader(shuffle_over_epochs=-1), 500) == indices


@FAST
@given(
    split=st.integers(0, 160),
    parallel=st.integers(1, 6),
    over_epochs=st.sampled_from([1, 2, -1]),
    excluded=st.frozensets(st.integers(0, 52), max_size=5),
)
def test_a_restored_reader_continues_like_the_uninterrupted_one(
    split, parallel, over_epochs, excluded
):
    def make():
        return _reader(parallel_slices=parallel, shuffle_over_epochs=over_epochs, excluded=excluded)

    reference = _take(make(), 200)
    first = make()
    head = _take(first, split)
    state = json.loads(json.dumps(first.state()))
    second = make()
    second.restore(state)
    assert head + _take(second, 200 - split) == reference
    assert second.state() == _advanced(make(), 200).state()


def _advanced(reader, n):
    _take(reader, n)
    return reader


def test_a_restored_validation_reader_continues_to_its_end():
    def make():
        return _reader(_bounds(num_samples=6), shuffle=False, repeat=False)

    for split in range(7):
        first = make()
        head = _take(first, split)
        second = make()
        second.restore(json.loads(json.dumps(first.state())))
        rest = []
        while True:
            try:
                rest.append(second.next())
            except StopIteration:
                break
        assert head + rest == [0, 1, 2, 3, 4, 5]


class Recorder:
    """A ReadObserver that remembers what it was told."""

    def __init__(self):
        self.ranges = []

    def will_read(self, first, end, later):
        self.ranges.append((first, end, later))

    def covers(self, index):
        return any(first <= index < end for first, end, _ in self.ranges)


def test_the_observer_hears_of_every_index_before_it_is_handed_out():
    recorder = Recorder()
    reader = _reader(observer=recorder)
    for _ in range(2 * 53):
        index = reader.next()
        assert recorder.covers(index)
    opened = [r for r in recorder.ranges if not r[2]]
    assert len(opened) >= 4, "the first open slices are announced as needed now"


def test_the_observer_changes_nothing_about_the_order_or_the_state():
    watched = _reader(observer=Recorder())
    plain = _reader()
    assert _take(watched, 120) == _take(plain, 120)
    assert watched.state() == plain.state()


def test_a_restored_reader_tells_its_observer_what_is_left_of_its_open_slices():
    first = _reader()
    _take(first, 20)
    recorder = Recorder()
    second = _reader(observer=recorder)
    second.restore(first.state())
    assert recorder.ranges == []  # nothing until the reader is used
    index = second.next()
    assert recorder.covers(index)
    open_slices = [(cursor, end) for _, cursor, end in _open(first)]
    assert [(a, b) for a, b, later in recorder.ranges if not later][: len(open_slices)] == (
        open_slices
    )


def _open(reader):
    state = reader.state()
    ends = [int(b) for b in reader.bounds[1:]]
    return [(s, cursor, ends[s]) for s, cursor in state["active"]]
