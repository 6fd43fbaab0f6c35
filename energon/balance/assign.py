"""Splitting a global step's samples over the ranks so that their costs are near-equal.

Pure and deterministic (a function of the cost list only, ties broken by position), so every rank
computes the same split without communicating. Longest-processing-time first gives a good start;
a few moves and swaps between the heaviest and the lightest rank then close the remaining gap.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def balance_costs(
    costs: Sequence[float], num_ranks: int, *, max_rounds: int | None = None
) -> list[list[int]]:
    """For each rank, the indices (into ``costs``, ascending) of the samples it gets."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    values = np.asarray(costs, dtype=np.float64)
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    heap = [(0.0, rank) for rank in range(num_ranks)]
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    loads = [0.0] * num_ranks
    for i in order:
        load, rank = heapq.heappop(heap)
        ranks[rank].append(i)
        loads[rank] = load + float(values[i])
        heapq.heappush(heap, (loads[rank], rank))
    rounds = max_rounds if max_rounds is not None else 4 * num_ranks + len(values)
    for _ in range(rounds):
        if not _improve(values, ranks, loads):
            break
    return [sorted(members) for members in ranks]


def _improve(values: np.ndarray, ranks: list[list[int]], loads: list[float]) -> bool:
    """One move or swap between the heaviest and the lightest rank that narrows their gap the
    most; False when none narrows it."""
    heavy = max(range(len(loads)), key=lambda r: (loads[r], -r))
    light = min(range(len(loads)), key=lambda r: (loads[r], r))
    gap = loads[heavy] - loads[light]
    if gap <= 0:
        return False
    a = values[ranks[heavy]]
    b = np.concatenate([[0.0], values[ranks[light]]])  # 0: a move instead of a swap
    delta = a[:, None] - b[None, :]  # load moved from heavy to light
    useful = (delta > 0) & (delta < gap)
    if not useful.any():
        return False
    badness = np.where(useful, np.abs(delta - gap / 2), np.inf)
    i, j = np.unravel_index(int(np.argmin(badness)), badness.shape)
    moved = float(delta[i, j])
    item = ranks[heavy].pop(int(i))
    ranks[light].append(item)
    if j > 0:
        back = ranks[light].pop(int(j) - 1)
        ranks[heavy].append(back)
    loads[heavy] -= moved
    loads[light] += moved
    return True


def straggler_ratio(rank_costs: Sequence[float]) -> float:
    """max / mean of the ranks' costs of one step (1.0: perfectly even)."""
    mean = sum(rank_costs) / len(rank_costs)
    return max(rank_costs) / mean if mean > 0 else 1.0
