"""``LogSampleDataset`` (``megatron.energon.wrappers.log_sample_dataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    PassThrough,
    SavableDataset,
    WorkerConfig,
)
from energon.sample_text import default_get_batch_keys

__all__ = [
    "BaseWrapperDataset",
    "LogSampleDataset",
    "SavableDataset",
    "WorkerConfig",
    "default_get_batch_keys",
]


class LogSampleDataset(PassThrough):
    """Accepted for compatibility; energon's logging is the loader's (``WorkerConfig`` debug
    options), so this node adds no stage."""

    def __init__(
        self,
        dataset: SavableDataset,
        mode: str,
        worker_config: WorkerConfig,
        get_keys_fn: Callable[[Any], list[str] | None] = default_get_batch_keys,
    ) -> None:
        self.mode = mode
        self.get_keys_fn = get_keys_fn
        super().__init__(dataset, worker_config=worker_config)
