"""``Balance``: the opt-in configuration of compute-balanced steps (``get_train_dataset(balance=)``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from energon.balance.cost import CostFunction, MultimodalCost, cost_config


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
    """

    max_length: int
    cost: CostFunction = dataclasses.field(default_factory=MultimodalCost)
    length: Callable[[Any], int] = _token_length
    over_length: str = "truncate"
    group: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.max_length < 1:
            raise ValueError(f"balance max_length must be >= 1, got {self.max_length}")
        if not callable(self.cost):
            raise TypeError("balance cost must be callable: SampleMeta -> SampleCost")

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
        }
