"""``EpochizeDataset``: a fixed number of micro-batches per loader pass (``megatron.energon.wrappers.epochize_dataset``)."""

from __future__ import annotations

from typing import Any

from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    PassThrough,
    SavableDataset,
    WorkerConfig,
)

__all__ = ["BaseWrapperDataset", "EpochizeDataset", "SavableDataset", "WorkerConfig"]


class EpochizeDataset(PassThrough):
    """Every loader pass yields ``length`` micro-batches per rank; the next pass continues where
    the previous one stopped. Must be the outermost wrapper."""

    outermost_only = True

    def __init__(self, dataset: SavableDataset, length: int, worker_config: WorkerConfig) -> None:
        self.length = length
        super().__init__(dataset, worker_config=worker_config)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return True, self.length, None

    def config(self) -> dict[str, Any]:
        return {
            "type": "EpochizeDataset",
            "length": self.length,
        }
