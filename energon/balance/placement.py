"""Placing samples, heaviest first, each on the bin with the most room: the greedy step of the
composition (:mod:`energon.balance.assign`), computed in rounds instead of one heap operation
per sample, with exactly the choices of the heap.

The heap rule: a bin's *key* is its load minus its level (most room: lowest key; ties: lowest
bin); each sample in turn goes to the bin of the lowest key, whose key then grows by the sample.
A heap pays ``log(bins)`` Python steps per sample, so the composition's cost per sample would
grow with the number of ranks. In rounds: line the bins up by key; the next samples go to the
next bins in line for as long as every bin taken in this round, with its new sample, stays
above the next bin in line (then the heap would have popped exactly these bins, in this order).
A round costs a few numpy passes over the bins and usually takes one sample for most bins, so
the cost per sample hardly depends on the number of bins. Where rounds stay short (free
samples: a bin's key does not grow, so the heap takes it again and again), the heap rule runs
on the front of the line only.
"""

from __future__ import annotations

import heapq

import numpy as np

# a round shorter than this hands over to the heap on the front of the line
SHORT_ROUND = 8
# how many bins the front-of-line heap holds, and how many samples it places at most at a time
FRONT_BINS = 64
FRONT_SAMPLES = 1024


def place_heaviest_first(loads: np.ndarray, levels: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The bin of each of ``costs`` (heaviest first) placed in turn on the bin of the lowest
    ``loads - levels`` (ties: the lowest bin); ``loads`` grows by each placed cost (in place),
    exactly as ``loads[b] += cost`` one sample at a time would make it."""
    line = Line(loads, levels, costs)
    while line.done < len(costs):
        line.place_round()
    return line.placed


def line_up(keys: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` bins of the lowest ``keys`` (ties: the lowest bin), lowest first: the bins
    a heap of ``(key, bin)`` would pop first if none went back."""
    return np.lexsort((np.arange(len(keys)), keys))[:count]


class Line:
    """The bins sorted by ``(key, bin)``: the order in which a heap would pop them; and the
    samples of ``costs`` placed so far (``placed[:done]``), whose costs are in ``loads``."""

    def __init__(self, loads: np.ndarray, levels: np.ndarray, costs: np.ndarray) -> None:
        self.loads, self.levels, self.costs = loads, levels, costs
        self.placed = np.empty(len(costs), dtype=np.int64)
        self.done = 0
        keys = loads - levels
        self.bins = line_up(keys, len(keys))
        self.keys = keys[self.bins]

    def place_round(self) -> None:
        """Places the next samples, as many as one round can take."""
        loads, done = self.loads, self.done
        count = min(len(self.costs) - done, len(self.bins))
        taken = self.bins[:count]
        new_loads = loads[taken] + self.costs[done : done + count]
        new_keys = new_loads - self.levels[taken]
        size = round_size(new_keys, self.keys[:count])
        if size < SHORT_ROUND:
            self.place_at_front()
            return
        loads[taken[:size]] = new_loads[:size]
        self.placed[done : done + size] = taken[:size]
        self.done += size
        self.requeue(new_keys[:size], taken[:size], size)

    def place_at_front(self) -> None:
        """The heap rule itself on the first bins of the line, for as long as the bin it pops
        comes before the first bin left out of the heap (which no sample has reached)."""
        width = min(len(self.bins), FRONT_BINS)
        front = self.bins[:width].tolist()
        heap = list(zip(self.keys[:width].tolist(), front))  # sorted, so a heap already
        bound = (float(self.keys[width]), int(self.bins[width])) if width < len(self.bins) else None
        load_of = dict(zip(front, self.loads[front].tolist()))
        level_of = dict(zip(front, self.levels[front].tolist()))
        for cost in self.costs[self.done : self.done + FRONT_SAMPLES].tolist():
            if bound is not None and heap[0] > bound:
                break
            b = heap[0][1]
            load_of[b] += cost
            heapq.heapreplace(heap, (load_of[b] - level_of[b], b))
            self.placed[self.done] = b
            self.done += 1
        self.loads[front] = [load_of[b] for b in front]
        keys, bins = zip(*heap)
        self.requeue(np.array(keys), np.array(bins, dtype=np.int64), width)

    def requeue(self, keys: np.ndarray, bins: np.ndarray, taken: int) -> None:
        """The first ``taken`` bins of the line are back with new ``keys``."""
        all_keys = np.concatenate([keys, self.keys[taken:]])
        all_bins = np.concatenate([bins, self.bins[taken:]])
        order = np.lexsort((all_bins, all_keys))
        self.keys, self.bins = all_keys[order], all_bins[order]


def round_size(new_keys: np.ndarray, line_keys: np.ndarray) -> int:
    """How many bins from the front of the line take one sample each, in line order, before a
    bin that took one would come first again: the longest prefix in which each bin of the line
    lies below every new key of the bins before it (strictly, so ties need no bin order)."""
    if len(new_keys) < 2:
        return len(new_keys)
    lowest = np.minimum.accumulate(new_keys[:-1])  # lowest new key of the bins before each
    stops = np.flatnonzero(lowest <= line_keys[1:])
    return int(stops[0]) + 1 if len(stops) else len(new_keys)
