"""Dividing a leaf among logical streams and cutting ranges into slices."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.plan.sharding import (
    bit_reversal_order,
    slice_bounds,
    split_piece,
    stream_count,
    stream_counts,
    stream_range,
    stream_ranges,
)

FAST = settings(max_examples=150, deadline=None)


@FAST
@given(n=st.integers(0, 300))
def test_bit_reversal_order_is_a_permutation(n):
    assert sorted(bit_reversal_order(n)) == list(range(n))


def test_bit_reversal_order_spreads_the_first_entries():
    assert bit_reversal_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reversal_order(5) == [0, 2, 1, 3, 4]


@FAST
@given(total=st.integers(0, 1000), num_streams=st.integers(1, 64), rotation=st.integers(0, 200))
def test_stream_counts_split_the_total_evenly(total, num_streams, rotation):
    counts = stream_counts(total, num_streams, rotation % num_streams)
    assert len(counts) == num_streams
    assert sum(counts) == total
    base, extra = divmod(total, num_streams)
    assert sorted(counts) == [base] * (num_streams - extra) + [base + 1] * extra


@FAST
@given(total=st.integers(0, 200), num_streams=st.integers(1, 33), rotation=st.integers(0, 32))
def test_rotation_moves_the_remainder_along_the_spread_order(total, num_streams, rotation):
    rotation %= num_streams
    order = bit_reversal_order(num_streams)
    plain = stream_counts(total, num_streams)
    rotated = stream_counts(total, num_streams, rotation)
    for g in range(num_streams):
        assert rotated[order[g]] == plain[order[(g - rotation) % num_streams]]


@FAST
@given(totals=st.lists(st.integers(0, 50), min_size=1, max_size=8), num_streams=st.integers(1, 16))
def test_rotating_each_source_by_the_samples_before_it_balances_the_streams(totals, num_streams):
    per_stream = [0] * num_streams
    before = 0
    for total in totals:
        for s, count in enumerate(stream_counts(total, num_streams, before % num_streams)):
            per_stream[s] += count
        before += total
    assert max(per_stream) - min(per_stream) <= 1


@FAST
@given(
    start=st.integers(0, 100),
    length=st.integers(0, 400),
    num_streams=st.integers(1, 20),
    rotation=st.integers(0, 19),
)
def test_stream_ranges_are_contiguous_and_cover_the_range(start, length, num_streams, rotation):
    end = start + length
    ranges = stream_ranges(start, end, num_streams, rotation % num_streams)
    assert ranges[0][0] == start and ranges[-1][1] == end
    for (_, b), (c, _) in itertools.pairwise(ranges):
        assert b == c
    assert [b - a for a, b in ranges] == stream_counts(length, num_streams, rotation % num_streams)


@FAST
@given(
    shard_sizes=st.lists(st.integers(1, 60), min_size=1, max_size=10),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    max_len=st.one_of(st.none(), st.integers(1, 40)),
)
def test_slices_stay_inside_the_range_and_its_shards(shard_sizes, cut, max_len):
    shard_starts = list(itertools.accumulate([0, *shard_sizes[:-1]]))
    total = sum(shard_sizes)
    start, end = sorted(int(c * total) for c in cut)
    bounds = [int(b) for b in slice_bounds(start, end, shard_starts, max_len)]
    if end <= start:
        assert bounds == [end]
        return
    assert bounds[0] == start and bounds[-1] == end
    assert all(a < b for a, b in itertools.pairwise(bounds)), "no empty slices"
    inner_shard_starts = {s for s in shard_starts if start < s < end}
    assert inner_shard_starts <= set(bounds), "every shard start inside the range is a cut"
    if max_len is not None:
        longest = max(b - a for a, b in itertools.pairwise(bounds))
        assert longest <= 1.5 * max_len + 1


def test_split_piece_keeps_short_pieces_whole_and_cuts_long_ones_evenly():
    assert split_piece(10, 25, 10) == [10]  # 15 <= 1.5 * 10
    assert split_piece(0, 16, 10) == [0, 8]
    assert split_piece(0, 100, 10) == list(range(0, 100, 10))
    assert split_piece(5, 6, None) == [5]


def _recursive_order(n: int) -> list[int]:
    """The spread order as first written: plain recursion over lists (the arrays must match it)."""
    if n <= 2:
        return list(range(n))
    left = _recursive_order(n // 2)
    right = [n // 2 + i for i in _recursive_order(n - n // 2)]
    out: list[int] = []
    for a, b in zip(left, right):
        out += [a, b]
    return out + right[len(left) :]


def _listed_counts(total: int, num_streams: int, rotation: int) -> list[int]:
    base, rem = divmod(total, num_streams)
    counts = [base + 1 if (g - rotation) % num_streams < rem else base for g in range(num_streams)]
    permuted = [0] * num_streams
    for i, target in enumerate(_recursive_order(num_streams)):
        permuted[target] = counts[i]
    return permuted


@pytest.mark.parametrize("n", [*range(0, 70), 1000, 4095, 4096, 4097, 32768])
def test_the_array_order_is_the_recursive_order(n):
    assert bit_reversal_order(n) == _recursive_order(n)


@FAST
@given(total=st.integers(0, 5000), num_streams=st.integers(1, 700), rotation=st.integers(0, 699))
def test_one_stream_at_a_time_is_every_stream_at_once(total, num_streams, rotation):
    rotation %= num_streams
    counts = _listed_counts(total, num_streams, rotation)
    assert stream_counts(total, num_streams, rotation) == counts
    ranges = stream_ranges(10, 10 + total, num_streams, rotation)
    for stream in {0, num_streams - 1, num_streams // 2, (total * 7) % num_streams}:
        assert stream_count(total, num_streams, rotation, stream) == counts[stream]
        assert stream_range(10, 10 + total, num_streams, rotation, stream) == ranges[stream]
        assert ranges[stream][0] == 10 + sum(counts[:stream])
