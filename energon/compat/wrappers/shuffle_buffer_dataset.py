"""``ShuffleBufferDataset``: a random sample of a buffer (``megatron.energon.wrappers.shuffle_buffer_dataset``)."""

from __future__ import annotations

from typing import Any

from energon import state_fields as fields
from energon.compat.rng import WorkerRng
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    open_stage,
)
from energon.compat.wrappers.buffer import SavableSampleBuffer
from energon.pipeline.keys import as_key
from energon.pipeline.stage import Item, Stage
from energon.plan.rng import CounterRng

__all__ = [
    "BaseWrapperDataset",
    "SavableDataset",
    "SavableSampleBuffer",
    "ShuffleBufferDataset",
    "WorkerConfig",
    "WorkerRng",
]


class _ShuffleStage(Stage):
    """Holds up to ``size`` samples and emits a uniformly random one; its state is their keys."""

    def __init__(self, upstream: Any, size: int, rng: CounterRng) -> None:
        self.upstream = upstream
        self.size = size
        self.rng = rng
        self._buffer: list[Item] = []
        self._exhausted = False

    def next(self) -> Item:
        while not self._exhausted and len(self._buffer) < self.size:
            try:
                self._buffer.append(next(self.upstream))
            except StopIteration:
                self._exhausted = True
        if not self._buffer:
            raise StopIteration
        i = self.rng.randbelow(len(self._buffer))
        self._buffer[i], self._buffer[-1] = self._buffer[-1], self._buffer[i]
        return self._buffer.pop()

    def state(self) -> dict[str, Any]:
        return {
            "buffer": [k for _, k in self._buffer],
            "rng": self.rng.counter,
            "exhausted": self._exhausted,
            "upstream": self.upstream.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        where = "ShuffleBufferDataset"
        self.upstream.restore(fields.get(state, "upstream", where))
        pending = fields.list_field(state, "buffer", where, max_len=self.size)
        keys = [as_key(k) for k in pending]
        self._buffer = [(self.upstream.rebuild(k), k) for k in keys]
        self.rng.counter = fields.int_field(state, "rng", where)
        self._exhausted = fields.bool_field(state, "exhausted", where)

    def rebuild(self, key: tuple) -> Any:
        return self.upstream.rebuild(key)


class ShuffleBufferDataset(BaseWrapperDataset):
    """Emits a random sample of a buffer of ``size`` (seeded per logical stream)."""

    def __init__(self, dataset: SavableDataset, size: int, *, worker_config: WorkerConfig) -> None:
        self.size = size
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _ShuffleStage(open_stage(self.dataset, ctx.child(0)), self.size, ctx.rng("shuffle"))

    def _own_config(self) -> dict[str, Any]:
        return {"size": self.size}
