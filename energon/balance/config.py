"""``Balance``: the opt-in configuration of compute-balanced steps (``get_train_dataset(balance=)``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from energon.balance.cost import (
    CostFunction,
    MultimodalCost,
    SampleCost,
    cost_config,
    trained_cost,
)
from energon.task_encoder.packing import OVER_LENGTH_POLICIES


def _token_length(sample: Any) -> int:
    tokens = sample["tokens"] if isinstance(sample, dict) else sample.tokens
    return int(tokens.shape[0]) if hasattr(tokens, "shape") else len(tokens)


@dataclasses.dataclass(frozen=True)
class Balance:
    """Pool the samples of each global step (``batch_size`` per rank on average), split them over
    the data-parallel ranks by ``cost`` and pack each rank's share into sequences of at most
    ``max_length`` tokens (``length``: an encoded sample's true token count; over-long samples
    follow ``over_length`` as in :class:`~energon.task_encoder.packing.SequencePacker`).

    ``group``: optional function of a sample's :class:`~energon.source.meta.SampleMeta` giving
    its group (e.g. an aspect-ratio bucket or the dataset); packs then hold one group each.

    ``window``: how many global steps are composed together
    (:func:`~energon.balance.assign.compose_steps`). A sample heavier than a rank's even share
    then shares its step with other heavy work instead of making its step straggle; such a step
    holds more samples than ``batch_size`` per rank (the window's average stays ``batch_size``).
    ``window=1`` balances each step on its own. An elastic restore (another number of ranks) of
    states saved inside a window first delivers the rest of that window, recomposed for the new
    ranks (:mod:`energon.balance.tail`).

    ``plan_store``: a directory every rank can read and write (a shared file system): each
    window is then planned once, by one rank, and the others read their shares from it
    (:mod:`energon.balance.plans`); without it every rank plans every window. ``plan_wait``:
    seconds a rank waits for a window's planner before planning it itself (with a warning).
    Neither changes the plans, so neither is part of the fingerprint.
    """

    max_length: int
    cost: CostFunction = dataclasses.field(default_factory=MultimodalCost)
    length: Callable[[Any], int] = _token_length
    over_length: str = "truncate"
    group: Callable[[Any], Any] | None = None
    window: int = 8
    plan_store: str | None = None
    plan_wait: float = 600.0

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise ValueError(f"balance max_length must be >= 1, got {self.max_length}")
        if self.over_length not in OVER_LENGTH_POLICIES:
            raise ValueError(
                f"balance over_length must be one of {OVER_LENGTH_POLICIES}, got "
                f"{self.over_length!r}"
            )
        if self.window < 1:
            raise ValueError(f"balance window must be >= 1 global step, got {self.window}")
        if self.plan_wait < 0:
            raise ValueError(f"balance plan_wait must be >= 0 seconds, got {self.plan_wait}")
        if not callable(self.cost):
            raise TypeError("balance cost must be callable: SampleMeta -> SampleCost")

    def planned_cost(self, cost: SampleCost) -> float:
        """What the plan counts of a sample estimated at ``cost``: only what is trained on of an
        over-long one (:func:`~energon.balance.cost.trained_cost` under ``over_length``)."""
        return trained_cost(self.cost, cost, self.max_length, self.over_length)

    def fingerprint(self) -> dict[str, Any]:
        """What must be equal for a saved state to mean the same steps."""
        group = None
        if self.group is not None:
            group = f"{self.group.__module__}.{getattr(self.group, '__qualname__', '?')}"
        return {
            "max_length": self.max_length,
            "cost": cost_config(self.cost),
            "over_length": self.over_length,
            "group": group,
            "window": self.window,
        }
