"""How a leaf dataset's samples are divided among logical streams and cut into slices.

The dataset is one concatenated index space ``[0, total)`` (shards in split order). Each logical stream
owns one contiguous range of it; the ranges differ in size by at most one sample. Ranges are then cut at
shard boundaries and into slices of about ``max_samples_per_sequence`` samples, the unit of shuffling.
The distribution follows the reference's algorithm, so ``L = world_size * num_workers`` streams get
the same ranges as the reference's global workers.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


def bit_reversal_order(n: int) -> list[int]:
    """Generalised bit-reversal permutation: spreads the +1 remainders evenly over streams."""
    return spread_order(n).tolist()


@functools.lru_cache(maxsize=64)
def spread_order(n: int) -> np.ndarray:
    """:func:`bit_reversal_order` as a read-only array, built level by level (each level has at
    most two distinct sizes, so the cache makes it O(n) in all, even for 32,768 streams).

    The order of ``n`` interleaves the order of the first ``n // 2`` with the order of the rest
    (shifted by ``n // 2``); the longer right half's surplus goes last."""
    if n <= 2:
        order = np.arange(n, dtype=np.int64)
    else:
        half = n // 2
        left, right = spread_order(half), half + spread_order(n - half)
        order = np.empty(n, dtype=np.int64)
        order[0 : 2 * half : 2] = left
        order[1 : 2 * half : 2] = right[:half]
        order[2 * half :] = right[half:]
    order.flags.writeable = False
    return order


@functools.lru_cache(maxsize=64)
def _stream_positions(n: int) -> np.ndarray:
    """The inverse of :func:`spread_order`: at which position of the order stream ``s`` stands."""
    inverse = np.empty(n, dtype=np.int64)
    inverse[spread_order(n)] = np.arange(n, dtype=np.int64)
    inverse.flags.writeable = False
    return inverse


def stream_counts_array(total: int, num_streams: int, rotation: int = 0) -> np.ndarray:
    """:func:`stream_counts` as an int64 array (what callers that sum over streams want)."""
    base, rem = divmod(total, num_streams)
    extra = (np.arange(num_streams, dtype=np.int64) - rotation) % num_streams < rem
    counts = np.empty(num_streams, dtype=np.int64)
    counts[spread_order(num_streams)] = base + extra
    return counts


def stream_counts(total: int, num_streams: int, rotation: int = 0) -> list[int]:
    """Number of samples of each stream; the ``total % num_streams`` extra ones go to spread streams."""
    return stream_counts_array(total, num_streams, rotation).tolist()


def stream_count(total: int, num_streams: int, rotation: int, stream: int) -> int:
    """``stream_counts(total, num_streams, rotation)[stream]`` without computing the others."""
    base, rem = divmod(total, num_streams)
    position = int(_stream_positions(num_streams)[stream])
    return base + int((position - rotation) % num_streams < rem)


def stream_ranges(
    start: int, end: int, num_streams: int, rotation: int = 0
) -> list[tuple[int, int]]:
    """Contiguous ``[a, b)`` range of each stream inside ``[start, end)``."""
    counts = stream_counts_array(end - start, num_streams, rotation)
    bounds = (start + np.concatenate(([0], np.cumsum(counts)))).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def stream_range(
    start: int, end: int, num_streams: int, rotation: int, stream: int
) -> tuple[int, int]:
    """``stream_ranges(start, end, num_streams, rotation)[stream]``, computed for one stream: a
    rank plans its own streams without listing everyone's."""
    base, rem = divmod(end - start, num_streams)
    first = start + stream * base + int(_extras_before(num_streams, rotation, rem)[stream])
    return first, first + stream_count(end - start, num_streams, rotation, stream)


@functools.lru_cache(maxsize=64)
def _extras_before(num_streams: int, rotation: int, rem: int) -> np.ndarray:
    """For each stream, how many streams before it get one of the ``rem`` extra samples: counted
    once per (streams, rotation, remainder), so that :func:`stream_range` is O(1) per stream
    (``energon simulate`` asks it of every one of 32,768 streams, once per source)."""
    extra = (_stream_positions(num_streams) - rotation) % num_streams < rem
    before = np.zeros(num_streams, dtype=np.int64)
    np.cumsum(extra[:-1], out=before[1:])
    before.flags.writeable = False
    return before


@runtime_checkable
class SearchableStarts(Protocol):
    """Sorted shard starts that can tell where a value falls without a binary search over
    ``__getitem__`` (a lazy sequence whose items cost a read)."""

    def search(self, value: int, side: str = "right") -> int:
        """``bisect_right`` (``side="right"``) or ``bisect_left`` of ``value``."""
        ...

    def load(self, first: int, end: int) -> None:
        """Read what the starts of the shards holding values ``[first, end)`` need, at once."""
        ...


def _search(starts: Sequence[int], value: int, side: str) -> int:
    if isinstance(starts, SearchableStarts):
        return starts.search(value, side)
    if side == "right":
        return bisect.bisect_right(starts, value)
    return bisect.bisect_left(starts, value)


def split_piece(start: int, end: int, max_len: int | None) -> list[int]:
    """Slice starts of one piece; pieces up to 1.5x ``max_len`` stay whole."""
    length = end - start
    if max_len is None or length <= 1.5 * max_len:
        return [start]
    k = max(round(length / max_len), 1)
    return [start + int(i * length / k) for i in range(k)]


def slice_bounds(
    start: int, end: int, shard_starts: Sequence[int], max_len: int | None
) -> np.ndarray:
    """Boundaries ``[s0, s1, ..., end]`` of the slices of range ``[start, end)``.

    ``shard_starts`` are the cumulative start offsets of the shards (first is 0; increasing).
    Only the starts inside the range are read (two searches and a slice), so a leaf may hand in a
    lazy sequence that loads what is asked for (a :class:`SearchableStarts` searches without
    probing all of it). Empty ranges give ``[end]``.
    """
    if end <= start:
        return np.array([end], dtype=np.int64)
    if isinstance(shard_starts, SearchableStarts):
        shard_starts.load(start, end)  # a lazy table: one read per level, not one per block
    first = _search(shard_starts, start, "right")
    last = max(first, _search(shard_starts, end, "left"))
    inner = [int(s) for s in shard_starts[first:last]]
    piece_bounds = [start, *inner, end]
    starts: list[int] = []
    for a, b in zip(piece_bounds, piece_bounds[1:]):
        starts += split_piece(a, b, max_len)
    cuts = starts + [end]
    return np.asarray(cuts, dtype=np.int64)
