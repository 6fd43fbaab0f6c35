"""``LimitDataset``: at most a number of micro-batches per loader pass (``megatron.energon.wrappers.limit_dataset``)."""

from __future__ import annotations

from typing import Any

from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    PassThrough,
    SavableDataset,
    WorkerConfig,
    is_plain,
    stream_rank_total,
)
from energon.loader import wrappers as core_wrappers

__all__ = ["BaseWrapperDataset", "LimitDataset", "SavableDataset", "WorkerConfig"]


class LimitDataset(PassThrough):
    """Every loader pass yields at most ``length`` micro-batches per rank; with
    ``reset_after_epoch=True`` each pass starts from the beginning again (validation), else it
    continues. Must be the outermost wrapper. Over a dataset of ``get_train_dataset`` /
    ``get_val_dataset`` this is the core's rule (:func:`energon.loader.wrappers.LimitDataset`)."""

    outermost_only = True

    def __new__(
        cls,
        dataset: SavableDataset,
        length: int,
        *,
        reset_after_epoch: bool = False,
        worker_config: WorkerConfig,
    ) -> Any:
        if is_plain(dataset):
            return core_wrappers.LimitDataset(
                dataset, length, reset_after_epoch=reset_after_epoch, worker_config=worker_config
            )
        return super().__new__(cls)

    def __init__(
        self,
        dataset: SavableDataset,
        length: int,
        *,
        reset_after_epoch: bool = False,
        worker_config: WorkerConfig,
    ) -> None:
        self.length = length
        self.reset_after_epoch = reset_after_epoch
        super().__init__(dataset, worker_config=worker_config)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        if self.reset_after_epoch:
            return False, 0, self.length
        return True, self.length, None

    def len_rank(self) -> int:
        return min(self.length, stream_rank_total(self))

    def config(self) -> dict[str, Any]:
        return {
            "type": "LimitDataset",
            "length": self.length,
            "reset_after_epoch": self.reset_after_epoch,
        }
