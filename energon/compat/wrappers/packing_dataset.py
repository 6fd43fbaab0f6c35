"""``PackingDataset``: sequence packing over a buffer (``megatron.energon.wrappers.packing_dataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon.compat.errors import ErrorContext, handle_restore_errors
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    add_sample_restore_key,
    error_policy,
    function_name,
    get_sample_restore_key,
    open_part,
    set_sample_restore_key,
)
from energon.compat.wrappers.buffer import SavableSampleBuffer
from energon.pipeline.assembly import PACK, Part
from energon.pipeline.packing import PackStage

__all__ = [
    "BaseWrapperDataset",
    "ErrorContext",
    "PackingDataset",
    "SampleIndex",
    "SavableDataset",
    "SavableSampleBuffer",
    "WorkerConfig",
    "add_sample_restore_key",
    "get_sample_restore_key",
    "handle_restore_errors",
    "set_sample_restore_key",
]


class PackingDataset(BaseWrapperDataset):
    """Sequence packing: ``pre_packer`` groups a buffer of samples, ``final_packer`` packs a group."""

    def __init__(
        self,
        dataset: SavableDataset,
        buffer_size: int,
        pre_packer: Callable[[list], list[list]],
        final_packer: Callable[[list], Any],
        *,
        final_packer_stateless: bool = False,
        sample_encoder: Callable[[Any], Any] | None = None,
        sample_encoder_stateless: bool = False,
        packer_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        pre_packer_failure_tolerance: int = 100,
        final_packer_failure_tolerance: int = 100,
        sample_encoder_failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.buffer_size = buffer_size
        self.pre_packer = pre_packer
        self.final_packer = final_packer
        self.final_packer_stateless = final_packer_stateless
        self.sample_encoder = sample_encoder
        self.sample_encoder_stateless = sample_encoder_stateless
        self.packer_config = packer_config
        self.final_packer_failure_tolerance = final_packer_failure_tolerance
        self.pre_packer_failure_tolerance = pre_packer_failure_tolerance
        self.sample_encoder_failure_tolerance = sample_encoder_failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        tolerance = self.final_packer_failure_tolerance
        policy = error_policy(self.worker_config, "PackingDataset", tolerance)

        def build(upstream: Any) -> PackStage:
            return PackStage(
                upstream,
                self.buffer_size,
                self.pre_packer,
                self.final_packer,
                self.sample_encoder,
                policy,
                stream=ctx.stream,
                num_streams=ctx.num_streams,
                empty_rounds_tolerance=self.pre_packer_failure_tolerance,
            )

        return open_part(self, ctx, Part(PACK, "PackingDataset"), build)

    def _stateless(self) -> bool:
        return self.final_packer_stateless and (
            self.sample_encoder is None or self.sample_encoder_stateless
        )

    def _own_config(self) -> dict[str, Any]:
        return {
            "buffer_size": self.buffer_size,
            "pre_packer": function_name(self.pre_packer),
            "final_packer": function_name(self.final_packer),
            "sample_encoder": function_name(self.sample_encoder) if self.sample_encoder else None,
        }
