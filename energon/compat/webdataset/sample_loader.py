"""``megatron.energon.flavors.webdataset.sample_loader``: the reference's leaf dataset, which reads
the slices of the current worker from ITar readers. energon's loaders never use it (their leaves
are planned per logical stream, :mod:`energon.source`); it is here for code that builds one by
hand: it yields the raw samples of the worker's slices, slice by slice (``shuffle_over_epochs``
set: the slices in a seeded random order), and its state is ``(slice index, position)``."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch.utils.data

from energon.compat.rng import WorkerRng
from energon.compat.savable import FlexState, Savable
from energon.compat.webdataset.itar_reader import ITarReader
from energon.compat.webdataset.structs import FilteredSample
from energon.loader.savable_dataset import SavableDataset
from energon.plan.rng import CounterRng, stable_seed
from energon.samples.edataclass import edataclass
from energon.worker import WorkerConfig

__all__ = [
    "FilteredSample",
    "FlexState",
    "ITarReader",
    "RawSampleData",
    "SavableDataset",
    "SliceState",
    "WebdatasetSampleLoaderDataset",
    "WorkerConfig",
    "WorkerRng",
    "edataclass",
]


@edataclass
class RawSampleData:
    """A raw sample: its restore key and the data of each joined reader."""

    __restore_key__: tuple[Any, ...]
    data: tuple[FilteredSample | None, ...]


@edataclass
class SliceState:
    """Which slice of the worker is being read, and the position in it."""

    index: int
    current: int


class WebdatasetSampleLoaderDataset(torch.utils.data.IterableDataset, Savable):
    """Raw samples of the slices ``workers_sample_slice_offsets[worker]`` (boundaries, as
    ``Sharder.slice_workers`` gives them), read from each of ``join_readers``."""

    def __init__(
        self,
        join_readers: Sequence[Any],
        workers_sample_slice_offsets: Sequence[Sequence[int]],
        *,
        worker_config: WorkerConfig,
        shuffle_over_epochs: int | None = None,
        parallel_slice_iters: int = 1,
    ) -> None:
        self.join_readers = list(join_readers)
        self.workers_sample_slice_offsets = [list(o) for o in workers_sample_slice_offsets]
        self.worker_config = worker_config
        self.shuffle_over_epochs = shuffle_over_epochs
        self.parallel_slice_iters = parallel_slice_iters
        self.reset_state_own()

    def _worker(self) -> int:
        info = torch.utils.data.get_worker_info()
        return 0 if info is None else info.id

    def _slices(self, worker: int) -> list[tuple[int, int]]:
        bounds = self.workers_sample_slice_offsets[worker]
        slices = list(zip(bounds, bounds[1:]))
        if self.shuffle_over_epochs is not None and slices:
            rng = CounterRng(stable_seed(self.worker_config.seed_offset, "slices", worker))
            order = list(range(len(slices)))
            for i in range(len(order) - 1, 0, -1):
                j = rng.randbelow(i + 1)
                order[i], order[j] = order[j], order[i]
            slices = [slices[i] for i in order]
        return slices

    def __iter__(self) -> Iterator[RawSampleData]:
        slices = self._slices(self._worker())
        while self.state.index < len(slices):
            start, end = slices[self.state.index]
            position = max(self.state.current, start)
            while position < end:
                self.state = SliceState(index=self.state.index, current=position + 1)
                yield self._load(position)
                position += 1
            self.state = SliceState(index=self.state.index + 1, current=0)

    def _load(self, index: int) -> RawSampleData:
        return RawSampleData(
            __restore_key__=("Webdataset", index),
            data=tuple(reader[index] for reader in self.join_readers),
        )

    def restore_sample(self, restore_key: tuple[Any, ...]) -> RawSampleData:
        kind, index = restore_key[:2]
        if kind != "Webdataset":
            raise ValueError(f"not a restore key of this dataset: {restore_key!r}")
        return self._load(int(index))

    def can_restore_sample(self) -> bool:
        return True

    def assert_can_restore(self) -> None:
        """Samples can always be regenerated from their keys."""

    def ensure_slice_offsets(self) -> None:
        for bounds in self.workers_sample_slice_offsets:
            if list(bounds) != sorted(bounds):
                raise ValueError(f"slice offsets must increase: {bounds}")

    def len_worker(self, worker_idx: int | None = None) -> int:
        bounds = self.workers_sample_slice_offsets[
            self._worker() if worker_idx is None else worker_idx
        ]
        return bounds[-1] - bounds[0] if bounds else 0

    def __len__(self) -> int:
        return sum(b[-1] - b[0] for b in self.workers_sample_slice_offsets if b)

    def worker_has_samples(self) -> bool:
        return self.len_worker() > 0

    def reset_state_own(self) -> None:
        self.state = SliceState(index=0, current=0)

    def save_state(self) -> FlexState:
        return FlexState(index=self.state.index, current=self.state.current)

    def restore_state(self, state: FlexState | None) -> None:
        if state is None:
            self.reset_state_own()
        else:
            self.state = SliceState(index=int(state["index"]), current=int(state["current"]))

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "slices": self.workers_sample_slice_offsets,
            "shuffle_over_epochs": self.shuffle_over_epochs,
            "parallel_slice_iters": self.parallel_slice_iters,
            "readers": [os.fspath(getattr(r, "base_path", "")) for r in self.join_readers],
        }
