"""``MapDataset``: a function on every sample (``megatron.energon.wrappers.map_dataset``)."""

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
)
from energon.pipeline.assembly import SAMPLE, Part
from energon.pipeline.stages import MapStage

__all__ = [
    "BaseWrapperDataset",
    "ErrorContext",
    "MapDataset",
    "SampleIndex",
    "SavableDataset",
    "WorkerConfig",
    "add_sample_restore_key",
    "get_sample_restore_key",
    "handle_restore_errors",
]


class MapDataset(BaseWrapperDataset):
    """``map_fn`` on every sample (a value or a generator of 0..n values; ``SkipSample`` drops)."""

    def __init__(
        self,
        dataset: SavableDataset,
        map_fn: Callable[[Any], Any],
        *,
        stateless_map_fn: bool = False,
        map_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        failure_tolerance: int = 100,
        worker_config: WorkerConfig,
    ) -> None:
        self.map_fn = map_fn
        self.stateless_map_fn = stateless_map_fn
        self.map_fn_config = map_fn_config
        self.failure_tolerance = failure_tolerance
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        name = f"MapDataset({function_name(self.map_fn)})"
        policy = error_policy(self.worker_config, name, self.failure_tolerance)

        def build(upstream: Any) -> MapStage:
            return MapStage(
                upstream,
                self.map_fn,
                "MapDataset",
                policy,
                stream=ctx.stream,
                num_streams=ctx.num_streams,
            )

        return open_part(self, ctx, Part(SAMPLE, "MapDataset", self.map_fn), build)

    def _stateless(self) -> bool:
        return self.stateless_map_fn

    def _own_config(self) -> dict[str, Any]:
        cfg = self.map_fn_config() if callable(self.map_fn_config) else self.map_fn_config
        return {
            "map_fn": function_name(self.map_fn),
            **({"map_fn_config": cfg} if cfg else {}),
            "map_fn_stateless": self.stateless_map_fn,
        }
