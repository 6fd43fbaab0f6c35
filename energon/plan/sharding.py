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

import numpy as np


def bit_reversal_order(n: int) -> list[int]:
    """Generalised bit-reversal permutation: spreads the +1 remainders evenly over streams."""
    if n <= 2:
        return list(range(n))
    return _interleave(
        bit_reversal_order(n // 2), [n // 2 + i for i in bit_reversal_order(n - n // 2)]
    )


def _interleave(left: list[int], right: list[int]) -> list[int]:
    out: list[int] = []
    for a, b in zip(left, right):
        out += [a, b]
    return out + right[len(left) :]


@functools.lru_cache(maxsize=16)
def _bit_reversal_targets(n: int) -> tuple[int, ...]:
    return tuple(bit_reversal_order(n))


def stream_counts(total: int, num_streams: int, rotation: int = 0) -> list[int]:
    """Number of samples of each stream; the ``total % num_streams`` extra ones go to spread streams."""
    base, rem = divmod(total, num_streams)
    counts = [base + 1 if (g - rotation) % num_streams < rem else base for g in range(num_streams)]
    permuted = [0] * num_streams
    for i, target in enumerate(_bit_reversal_targets(num_streams)):
        permuted[target] = counts[i]
    return permuted


def stream_ranges(
    start: int, end: int, num_streams: int, rotation: int = 0
) -> list[tuple[int, int]]:
    """Contiguous ``[a, b)`` range of each stream inside ``[start, end)``."""
    ranges = []
    pos = start
    for count in stream_counts(end - start, num_streams, rotation):
        ranges.append((pos, pos + count))
        pos += count
    return ranges


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

    ``shard_starts`` are the cumulative start offsets of the shards (first is 0). Empty ranges give
    ``[end]``.
    """
    if end <= start:
        return np.array([end], dtype=np.int64)
    first = bisect.bisect_right(shard_starts, start)
    inner = [s for s in shard_starts[first:] if s < end]
    piece_bounds = [start, *inner, end]
    starts: list[int] = []
    for a, b in zip(piece_bounds, piece_bounds[1:]):
        starts += split_piece(a, b, max_len)
    cuts = starts + [end]
    return np.asarray(cuts, dtype=np.int64)
