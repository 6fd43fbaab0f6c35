"""``MixBatchDataset`` and the batch mixers (``megatron.energon.wrappers.mix_batch_dataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SavableDataset,
    WorkerConfig,
)
from energon.compat.wrappers.batch_dataset import BatchDataset
from energon.compat.wrappers.blend_dataset import BlendDataset
from energon.samples.collate import concat_pad, generic_concat, homogeneous_concat_mix

__all__ = [
    "BaseWrapperDataset",
    "BatchDataset",
    "BlendDataset",
    "MixBatchDataset",
    "SavableDataset",
    "WorkerConfig",
    "concat_pad",
    "generic_concat",
    "homogeneous_concat_mix",
]


class MixBatchDataset(BatchDataset):
    """Batches mixed from already batched datasets: ``BatchDataset(BlendDataset(...))`` whose
    ``batch_mix_fn`` gets the list of sub-batches (``homogeneous_concat_mix`` concatenates them)."""

    def __init__(
        self,
        *dataset_weights: tuple[SavableDataset, float],
        batch_size: int,
        batch_mix_fn: Callable[[list], Any] = lambda x: x,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(
            BlendDataset(*dataset_weights, worker_config=worker_config),
            batch_size,
            batch_mix_fn,
            batcher_stateless=True,
            worker_config=worker_config,
        )
