"""``BlendDataset``: a weighted random blend (``megatron.energon.wrappers.blend_dataset``)."""

from __future__ import annotations

from typing import Any

from energon import state_fields as fields
from energon.compat.rng import WorkerRng
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
from energon.plan.rng import CounterRng

__all__ = [
    "BaseWrapperDataset",
    "BlendDataset",
    "SavableDataset",
    "WorkerConfig",
    "WorkerRng",
    "add_sample_restore_key",
]


class _BlendStage(Stage):
    """Per step, a child drawn with probability proportional to its weight; a child that ends is
    dropped; the blend ends when all have ended."""

    def __init__(self, children: list[Any], weights: list[float], rng: CounterRng) -> None:
        self.children = children
        self.weights = weights
        self.rng = rng
        self.exhausted = [False] * len(children)

    def next(self) -> Item:
        while True:
            weights = [0.0 if done else w for w, done in zip(self.weights, self.exhausted)]
            if sum(weights) <= 0:
                raise StopIteration
            i = self.rng.choice_weighted(weights)
            try:
                value, key = next(self.children[i])
            except StopIteration:
                self.exhausted[i] = True
                continue
            key = child_key("BlendDataset", i, key)
            attach_restore_key(value, key)
            return value, key

    def state(self) -> dict[str, Any]:
        return {
            "exhausted": list(self.exhausted),
            "rng": self.rng.counter,
            "datasets": [child.state() for child in self.children],
        }

    def restore(self, state: dict[str, Any]) -> None:
        where = "BlendDataset"
        count = len(self.children)
        exhausted = fields.list_field(state, "exhausted", where, max_len=count)
        datasets = fields.list_field(state, "datasets", where, max_len=count)
        if len(datasets) != count:
            raise fields.bad_field(f"{where}.datasets", datasets, f"the states of {count} children")
        if len(exhausted) != count or not all(isinstance(x, bool) for x in exhausted):
            raise fields.bad_field(f"{where}.exhausted", exhausted, f"{count} true or false")
        self.exhausted = exhausted
        self.rng.counter = fields.int_field(state, "rng", where)
        for child, child_state in zip(self.children, datasets):
            child.restore(child_state)

    def rebuild(self, key: tuple) -> Any:
        i, inner = child_parts(key, "BlendDataset", len(self.children))
        value = self.children[i].rebuild(inner)
        attach_restore_key(value, key)
        return value


class BlendDataset(BaseWrapperDataset):
    """Weighted random blend: each output comes from a dataset drawn by weight (per logical
    stream, seeded); a dataset that ends drops out."""

    def __init__(
        self, *dataset_weights: tuple[SavableDataset, float], worker_config: WorkerConfig
    ) -> None:
        for entry in dataset_weights:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise TypeError("BlendDataset takes (dataset, weight) tuples")
        self.dataset_weights = tuple(dataset_weights)
        self.weights = tuple(float(w) for _, w in dataset_weights)
        super().__init__([d for d, _ in dataset_weights], worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        children = [open_stage(d, ctx.child(i)) for i, d in enumerate(self.datasets)]
        return _BlendStage(children, list(self.weights), ctx.rng("blend"))

    def len_stream(self, stream: int, num_streams: int) -> int:
        return sum(stream_length(d, stream, num_streams) for d in self.datasets)

    def _own_config(self) -> dict[str, Any]:
        return {"weights": list(self.weights)}

    def _children_config(self) -> dict[str, Any]:
        return {"dataset_weights": [[d.config(), w] for d, w in self.dataset_weights]}
