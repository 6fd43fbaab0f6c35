"""What a balanced window promises: the straggler bound, and when it holds.

A step's *straggler ratio* is its heaviest rank's cost over the mean of its ranks' costs (1.0:
perfectly even); a training step waits for its heaviest rank, so ``ratio - 1`` is the share of
the step that the other ranks idle. No split of a step's samples beats ``h_s / m_s`` (its
heaviest sample over its mean rank share), and no composition of a window beats
``R * h / total`` for the step that holds its heaviest sample ``h`` (that step holds at most all
of the window's work). :func:`~energon.balance.assign.compose_steps` keeps:

- **Leveled windows.** When the window holds enough light work to level the ranks
  (:func:`can_level`: its samples of at most a tenth of the mean rank share add up to at least
  ``R - 1`` times its heaviest sample, the work that brings the other ranks of the heaviest
  sample's step up to it), every step is within :data:`TOLERANCE` (1.05).
- **Other windows.** A step above the tolerance is as even as its own samples allow (no move
  of one sample, nor swap of two, between its heaviest rank and another rank narrows their
  gap), and the window has nothing to spare for it: no sample of another step could join its
  lightest rank and lower its ratio while that other step stays within the tolerance and every
  rank keeps a sample.
"""

from __future__ import annotations

from collections.abc import Sequence

TOLERANCE = 1.05  # the straggler ratio every step keeps when the window can level its ranks
LIGHT_SHARE = 10  # a light sample costs at most 1/LIGHT_SHARE of the window's mean rank share


def can_level(costs: Sequence[float], num_ranks: int, num_steps: int) -> bool:
    """True when a window of ``num_steps`` steps on ``num_ranks`` ranks holds enough light work
    to level its ranks: its light samples (at most a tenth of the mean rank share each) add up
    to at least ``num_ranks - 1`` times its heaviest sample."""
    if not len(costs):
        return True
    total = float(sum(costs))
    light = total / (num_ranks * num_steps * LIGHT_SHARE)
    spare = sum(float(c) for c in costs if c <= light)
    return spare >= (num_ranks - 1) * float(max(costs))


def step_lower_bound(sample_costs: Sequence[float], num_ranks: int) -> float:
    """The best straggler ratio any split of one step's samples can reach: its heaviest sample
    over its mean rank share (at least 1.0)."""
    total = float(sum(sample_costs))
    if total <= 0:
        return 1.0
    return max(1.0, num_ranks * float(max(sample_costs)) / total)


def window_lower_bound(costs: Sequence[float], num_ranks: int) -> float:
    """The best straggler ratio any composition of a window can reach for the step that holds
    its heaviest sample (that step holding all of the window's work)."""
    return step_lower_bound(costs, num_ranks)
