"""``IterMapDataset``: a stream-to-stream function (``megatron.energon.wrappers.iter_map_dataset``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from energon import state_fields as fields
from energon.compat.errors import ErrorContext, handle_restore_errors
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SampleIndex,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    function_name,
    get_sample_restore_key,
    open_stage,
    set_sample_restore_key,
    stream_length,
)
from energon.pipeline.keys import as_key, attach_restore_key, members_key, members_parts
from energon.pipeline.stage import Item, Stage
from energon.task_encoder.base import hook_context

__all__ = [
    "BaseWrapperDataset",
    "ErrorContext",
    "IterMapDataset",
    "SampleIndex",
    "SavableDataset",
    "WorkerConfig",
    "get_sample_restore_key",
    "handle_restore_errors",
    "set_sample_restore_key",
]


class _IterMapStage(Stage):
    """``iter_map_fn`` over the upstream as an iterator. An output's key lists the inputs consumed
    since the previous output, so a restored stage replays exactly those into a fresh iterator."""

    def __init__(
        self, upstream: Any, fn: Callable[[Iterator], Iterator], ctx: StreamContext
    ) -> None:
        self.upstream = upstream
        self.fn = fn
        self.ctx = ctx
        self._outputs = 0
        self._pending: list[Item] = []  # consumed since the last output
        self._replay: list[Item] = []
        self._iterator: Iterator | None = None

    def _inputs(self) -> Iterator[Any]:
        while True:
            if self._replay:
                item = self._replay.pop(0)
            else:
                try:
                    item = next(self.upstream)
                except StopIteration:
                    return
            self._pending.append(item)
            yield item[0]

    def next(self) -> Item:
        if self._iterator is None:
            self._iterator = iter(self.fn(self._inputs()))
        previous = hook_context.sample_index
        hook_context.sample_index = self._outputs * self.ctx.num_streams + self.ctx.stream
        try:
            value = next(self._iterator)
        finally:
            hook_context.sample_index = previous
        key = members_key("IterMapDataset", self._outputs, tuple(k for _, k in self._pending))
        self._outputs += 1
        self._pending = []
        attach_restore_key(value, key)
        return value, key

    def state(self) -> dict[str, Any]:
        return {
            "outputs": self._outputs,
            "pending": [k for _, k in self._pending],
            "upstream": self.upstream.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        where = "IterMapDataset"
        self._outputs = fields.int_field(state, "outputs", where)
        self.upstream.restore(fields.get(state, "upstream", where))
        keys = [as_key(k) for k in fields.list_field(state, "pending", where)]
        self._replay = [(self.upstream.rebuild(k), k) for k in keys]
        self._pending = []
        self._iterator = None

    def rebuild(self, key: tuple) -> Any:
        members = members_parts(key, "IterMapDataset")
        values = [self.upstream.rebuild(k) for k in members]
        return next(iter(self.fn(iter(values))))


class IterMapDataset(BaseWrapperDataset):
    """A stream-to-stream function: ``iter_map_fn(iterator of samples) -> iterator of outputs``."""

    def __init__(
        self,
        dataset: SavableDataset,
        iter_map_fn: Callable[[Iterator], Iterator],
        *,
        len_map_fn: Callable[[int], int] = lambda x: x,
        stateless_iter_fn: bool = False,
        iter_map_fn_config: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        worker_config: WorkerConfig,
    ) -> None:
        self.iter_map_fn = iter_map_fn
        self.len_map_fn = len_map_fn
        self.stateless_iter_fn = stateless_iter_fn
        self.iter_map_fn_config = iter_map_fn_config
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _IterMapStage(open_stage(self.dataset, ctx.child(0)), self.iter_map_fn, ctx)

    def len_stream(self, stream: int, num_streams: int) -> int:
        return self.len_map_fn(stream_length(self.dataset, stream, num_streams))

    def _stateless(self) -> bool:
        return self.stateless_iter_fn

    def _own_config(self) -> dict[str, Any]:
        return {
            "iter_map_fn": function_name(self.iter_map_fn),
            "len_map_fn": function_name(self.len_map_fn),
        }
