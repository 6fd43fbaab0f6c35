"""``ConcatDataset``: datasets one after the other (``megatron.energon.wrappers.concat_dataset``)."""

from __future__ import annotations

from typing import Any

from energon import state_fields as fields
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    add_sample_restore_key,
    open_stage,
    stream_length,
)
from energon.pipeline.keys import attach_restore_key, child_key, child_parts
from energon.pipeline.stage import Item, Stage

__all__ = [
    "BaseWrapperDataset",
    "ConcatDataset",
    "SavableDataset",
    "WorkerConfig",
    "add_sample_restore_key",
]


class _ConcatStage(Stage):
    def __init__(self, children: list[Any]) -> None:
        self.children = children
        self.current = 0

    def next(self) -> Item:
        while self.current < len(self.children):
            try:
                value, key = next(self.children[self.current])
            except StopIteration:
                self.current += 1
                continue
            key = child_key("ConcatDataset", self.current, key)
            attach_restore_key(value, key)
            return value, key
        raise StopIteration

    def state(self) -> dict[str, Any]:
        return {"current": self.current, "datasets": [c.state() for c in self.children]}

    def restore(self, state: dict[str, Any]) -> None:
        where = "ConcatDataset"
        count = len(self.children)
        self.current = fields.int_field(state, "current", where, high=count)
        datasets = fields.list_field(state, "datasets", where, max_len=count)
        if len(datasets) != count:
            raise fields.bad_field(f"{where}.datasets", datasets, f"the states of {count} children")
        for child, child_state in zip(self.children, datasets):
            child.restore(child_state)

    def rebuild(self, key: tuple) -> Any:
        i, inner = child_parts(key, "ConcatDataset", len(self.children))
        value = self.children[i].rebuild(inner)
        attach_restore_key(value, key)
        return value


class ConcatDataset(BaseWrapperDataset):
    """The datasets one after the other (per logical stream)."""

    def __init__(self, *datasets: SavableDataset, worker_config: WorkerConfig) -> None:
        super().__init__(list(datasets), worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _ConcatStage([open_stage(d, ctx.child(i)) for i, d in enumerate(self.datasets)])

    def len_stream(self, stream: int, num_streams: int) -> int:
        return sum(stream_length(d, stream, num_streams) for d in self.datasets)

    def _children_config(self) -> dict[str, Any]:
        return {"datasets": [d.config() for d in self.datasets]}
