"""``BatchDataset``: batches of consecutive samples (``megatron.energon.wrappers.batch_dataset``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from energon.compat.errors import ErrorContext, handle_restore_errors
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    error_policy,
    function_name,
    get_sample_restore_key,
    open_part,
    set_sample_restore_key,
    stream_length,
)
from energon.pipeline.assembly import BATCH, Part
from energon.pipeline.stages import BatchStage

__all__ = [
    "BaseWrapperDataset",
    "BatchDataset",
    "ErrorContext",
    "SampleIndex",
    "SavableDataset",
    "WorkerConfig",
    "get_sample_restore_key",
    "handle_restore_errors",
    "set_sample_restore_key",
]


class BatchDataset(BaseWrapperDataset):
    """Batches of ``batch_size`` consecutive samples (the last one partial unless ``drop_last``)."""

    def __init__(
        self,
        dataset: SavableDataset,
        batch_size: int,
        batcher: Callable[[list], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.batch_size = batch_size
        self.batcher = batcher
        self.batcher_stateless = batcher_stateless
        self.batcher_config = batcher_config
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        size = self.batch_size
        policy = error_policy(self.worker_config, "BatchDataset", self.failure_tolerance)

        def build(upstream: Any) -> BatchStage:
            return BatchStage(
                upstream, lambda _: size, self.batcher, policy, drop_last=self.drop_last
            )

        return open_part(self, ctx, Part(BATCH, "BatchDataset"), build)

    def len_stream(self, stream: int, num_streams: int) -> int:
        n = stream_length(self.dataset, stream, num_streams)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def micro_batch_size(self) -> int | None:
        return self.batch_size

    def _stateless(self) -> bool:
        return self.batcher_stateless

    def _own_config(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "batcher": function_name(self.batcher),
            "batcher_stateless": self.batcher_stateless,
            "drop_last": self.drop_last,
        }
