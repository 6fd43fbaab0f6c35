"""``FilterDataset``: keeps the samples a predicate accepts (``megatron.energon.wrappers.filter_dataset``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from energon import state_fields as fields
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    function_name,
    open_stage,
)
from energon.pipeline.stage import Item, Stage
from energon.task_encoder.base import hook_context

__all__ = ["BaseWrapperDataset", "FilterDataset", "SampleIndex", "SavableDataset", "WorkerConfig"]


class _FilterStage(Stage):
    def __init__(self, upstream: Any, fn: Callable[[Any], bool], ctx: StreamContext) -> None:
        self.upstream = upstream
        self.fn = fn
        self.ctx = ctx
        self._inputs = 0

    def next(self) -> Item:
        while True:
            value, key = next(self.upstream)
            previous = hook_context.sample_index
            hook_context.sample_index = self._inputs * self.ctx.num_streams + self.ctx.stream
            self._inputs += 1
            try:
                keep = self.fn(value)
            finally:
                hook_context.sample_index = previous
            if keep:
                return value, key

    def state(self) -> dict[str, Any]:
        return {"inputs": self._inputs, "upstream": self.upstream.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self._inputs = fields.int_field(state, "inputs", "FilterDataset")
        self.upstream.restore(fields.get(state, "upstream", "FilterDataset"))

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class FilterDataset(BaseWrapperDataset):
    """Keeps the samples for which ``filter_fn`` is true."""

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        filter_fn: Callable[[Any], bool],
        filter_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        self.filter_fn = filter_fn
        self.filter_fn_config = filter_fn_config
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _FilterStage(open_stage(self.dataset, ctx.child(0)), self.filter_fn, ctx)

    def _own_config(self) -> dict[str, Any]:
        return {"filter_fn": function_name(self.filter_fn)}
