"""``GroupBatchDataset``: batches of samples that share a group key (``megatron.energon.wrappers.group_batch_dataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon.compat.errors import ErrorContext, handle_restore_errors
from energon.compat.savable import FlexState, Savable
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    error_policy,
    function_name,
    open_part,
    set_sample_restore_key,
)
from energon.compat.wrappers.buffer import SavableSampleBuffer
from energon.pipeline.assembly import GROUP, Part
from energon.pipeline.stages import GroupBatchStage
from energon.samples.edataclass import edataclass

__all__ = [
    "BaseWrapperDataset",
    "Bucket",
    "ErrorContext",
    "FlexState",
    "GroupBatchDataset",
    "SampleIndex",
    "Savable",
    "SavableDataset",
    "SavableSampleBuffer",
    "WorkerConfig",
    "edataclass",
    "handle_restore_errors",
    "set_sample_restore_key",
]


class GroupBatchDataset(BaseWrapperDataset):
    """Batches of samples sharing a group key; ``sample_group_key(sample) -> (key, batch_size)``."""

    def __init__(
        self,
        dataset: SavableDataset,
        fixed_batch_size: int | None,
        sample_group_key: Callable[[Any], tuple[Any, int | None]],
        batcher: Callable[[list], Any],
        *,
        batcher_stateless: bool = False,
        batcher_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        drop_last: bool = False,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.fixed_batch_size = fixed_batch_size
        self.sample_group_key = sample_group_key
        self.batcher = batcher
        self.batcher_stateless = batcher_stateless
        self.batcher_config = batcher_config
        self.drop_last = drop_last
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        policy = error_policy(self.worker_config, "GroupBatchDataset", self.failure_tolerance)

        def build(upstream: Any) -> GroupBatchStage:
            return GroupBatchStage(
                upstream,
                self.sample_group_key,
                self.batcher,
                policy,
                batch_size=self.fixed_batch_size,
                drop_last=self.drop_last,
                stream=ctx.stream,
                num_streams=ctx.num_streams,
            )

        return open_part(self, ctx, Part(GROUP, "GroupBatchDataset"), build)

    def micro_batch_size(self) -> int | None:
        return self.fixed_batch_size

    def restore_sample(self, index: Any) -> Any:
        """Regenerate a batch from its ``__restore_key__`` (see ``BaseWrapperDataset``)."""
        return super().restore_sample(index)

    def _stateless(self) -> bool:
        return self.batcher_stateless

    def _own_config(self) -> dict[str, Any]:
        return {
            "fixed_batch_size": self.fixed_batch_size,
            "sample_group_key": function_name(self.sample_group_key),
            "batcher": function_name(self.batcher),
            "drop_last": self.drop_last,
        }


@edataclass
class Bucket(Savable):
    """The samples gathered for one group key, and the batch size of that group."""

    batch_size: int
    samples: SavableSampleBuffer

    def save_state(self) -> FlexState:
        return FlexState(batch_size=self.batch_size, samples=self.samples.save_state())

    def restore_state(self, state: FlexState | None) -> None:
        if state is None:
            self.samples.restore_state(None)
            return
        self.batch_size = state["batch_size"]
        self.samples.restore_state(state["samples"])
