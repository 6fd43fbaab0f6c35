"""``RepeatDataset``: a dataset again and again (``megatron.energon.wrappers.repeat_dataset``)."""

from __future__ import annotations

from typing import Any

from energon import state_fields as fields
from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    SavableDataset,
    StreamContext,
    WorkerConfig,
    is_plain,
    open_stage,
    stream_length,
)
from energon.loader import wrappers as core_wrappers
from energon.pipeline.stage import Item, Stage

__all__ = ["BaseWrapperDataset", "RepeatDataset", "SavableDataset", "WorkerConfig"]


class _RepeatStage(Stage):
    """Re-opens its child when it ends (a new pass, reshuffled); ``repeats=None`` repeats forever,
    a fraction yields that share of the next pass. A child that yields nothing ends the repeat."""

    def __init__(self, node: RepeatDataset, ctx: StreamContext) -> None:
        self.node = node
        self.ctx = ctx
        self.repetition = 0
        self.index = 0
        self.child = self._open(0)
        self._tail: int | None = None

    def _open(self, repetition: int) -> Any:
        ctx = self.ctx.child(0)
        return open_stage(self.node.dataset, ctx.next_epoch(repetition) if repetition else ctx)

    def _tail_length(self) -> int:
        if self._tail is None:
            fraction = self.node.repeats - int(self.node.repeats)
            per_pass = stream_length(self.node.dataset, self.ctx.stream, self.ctx.num_streams)
            self._tail = int(per_pass * fraction)
        return self._tail

    def next(self) -> Item:
        repeats = self.node.repeats
        while True:
            if repeats is not None:
                whole = int(repeats)
                if self.repetition > whole or (
                    self.repetition == whole and self.index >= self._tail_length()
                ):
                    raise StopIteration
            try:
                item = next(self.child)
            except StopIteration:
                if self.index == 0:
                    raise  # nothing to repeat on this stream
                self.repetition += 1
                self.index = 0
                self.child = self._open(self.repetition)
                continue
            self.index += 1
            return item

    def state(self) -> dict[str, Any]:
        return {"repetition": self.repetition, "index": self.index, "dataset": self.child.state()}

    def restore(self, state: dict[str, Any]) -> None:
        where = "RepeatDataset"
        self.repetition = fields.int_field(state, "repetition", where)
        self.index = fields.int_field(state, "index", where)
        self.child = self._open(self.repetition)
        self.child.restore(fields.get(state, "dataset", where))

    def rebuild(self, key: tuple) -> Any:
        return self.child.rebuild(key)


class RepeatDataset(BaseWrapperDataset):
    """The dataset again and again (``repeats=None``: forever; a number: that many passes).

    Over a dataset of ``get_train_dataset`` / ``get_val_dataset`` this is the core's pass-length
    rule (:func:`energon.loader.wrappers.RepeatDataset`, exact totals, elastic); only a composed
    chain gets a node."""

    def __new__(
        cls,
        dataset: SavableDataset,
        *,
        repeats: int | float | None = None,
        restart: bool = True,
        worker_config: WorkerConfig,
    ) -> Any:
        if is_plain(dataset):
            return core_wrappers.RepeatDataset(
                dataset, repeats=repeats, restart=restart, worker_config=worker_config
            )
        return super().__new__(cls)

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        repeats: int | float | None = None,
        restart: bool = True,
        worker_config: WorkerConfig,
    ) -> None:
        self.repeats = repeats
        self.restart = restart
        super().__init__(dataset, worker_config=worker_config)

    def open(self, ctx: StreamContext) -> Any:
        return _RepeatStage(self, ctx)

    def len_stream(self, stream: int, num_streams: int) -> int:
        inner = stream_length(self.dataset, stream, num_streams)
        return inner if self.repeats is None else int(inner * self.repeats)

    def _pass_rule(self) -> tuple[bool, int, int | None]:
        return True, 0, None  # infinite or a fixed number of passes: continue across loops

    def _own_config(self) -> dict[str, Any]:
        return {"repeats": self.repeats}
