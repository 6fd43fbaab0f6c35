"""Splitting the samples of global steps over the ranks so that their costs are near-equal.

Pure and deterministic (a function of the cost list only, ties broken by position), so every rank
computes the same split without communicating. :func:`balance_costs` splits one step:
longest-processing-time first gives a good start; a few moves and swaps between the heaviest and
the lightest rank then close the remaining gap. :func:`compose_steps` composes a window of several
steps at once, so that a sample heavier than a rank's share shares its step with other heavy work.
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


def compose_steps(costs: Sequence[float], num_ranks: int, num_steps: int) -> list[list[list[int]]]:
    """``[step][rank]`` -> the indices (into ``costs``, ascending) of the samples that rank gets
    at that step of a window of ``num_steps`` global steps.

    Steps need not cost the same, only the ranks within a step. A sample heavier than an even
    share (total / (steps * ranks)) would make its step straggle whatever the split, so the
    heaviest samples *anchor* steps, ``num_ranks`` of them per step (the heaviest together), and
    every step gets a *level*: its heaviest anchor, at least the even level left for the others
    (water filling). Each remaining sample, heaviest first, goes to the bin with the most room
    below its step's level; moves and swaps within each step then close the remaining gaps.
    Pure and deterministic (ties broken by index), so every rank computes the same steps.
    """
    if num_ranks < 1 or num_steps < 1:
        raise ValueError(f"need num_ranks >= 1 and num_steps >= 1, got {num_ranks}, {num_steps}")
    values = np.asarray(costs, dtype=np.float64)
    floats = values.tolist()  # the same float64 values, read without numpy's per-item cost
    order = sorted(range(len(floats)), key=lambda i: (-floats[i], i))
    bins = num_steps * num_ranks
    even = float(values.sum()) / bins if len(values) else 0.0
    anchors = [i for i in order if floats[i] > even]
    members: list[list[int]] = [[] for _ in range(bins)]
    loads = [0.0] * bins
    for n, i in enumerate(anchors):
        members[n].append(i)
        loads[n] = floats[i]
    levels = _step_levels(float(values.sum()), loads, num_ranks, num_steps)
    heap = [(-(levels[b // num_ranks] - loads[b]), b) for b in range(bins)]
    heapq.heapify(heap)
    for i in order[len(anchors) :]:
        _, b = heapq.heappop(heap)
        members[b].append(i)
        loads[b] += floats[i]
        heapq.heappush(heap, (-(levels[b // num_ranks] - loads[b]), b))
    steps = []
    for s in range(num_steps):
        ranks = members[s * num_ranks : (s + 1) * num_ranks]
        step_loads = loads[s * num_ranks : (s + 1) * num_ranks]
        for _ in range(4 * num_ranks + sum(map(len, ranks))):
            if not _improve(values, ranks, step_loads):
                break
        steps.append([sorted(share) for share in ranks])
    return steps


def _step_levels(
    total: float, anchored: list[float], num_ranks: int, num_steps: int
) -> list[float]:
    """Each step's target cost per rank: its heaviest anchor, and one common level ``T`` for
    the rest such that ``num_ranks * sum(levels) == total`` where the anchors allow it."""
    tops = [max(anchored[s * num_ranks : (s + 1) * num_ranks]) for s in range(num_steps)]
    ranked = sorted(tops, reverse=True)
    fixed = 0.0
    common = 0.0
    for j in range(num_steps):  # the j heaviest steps keep their anchor's level
        common = (total / num_ranks - fixed) / (num_steps - j)
        if common >= ranked[j]:
            break
        fixed += ranked[j]
    else:
        common = 0.0
    return [max(common, top) for top in tops]


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
