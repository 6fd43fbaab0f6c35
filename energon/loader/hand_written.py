"""Hand-written datasets: ``SavableDataset`` subclasses that yield their items from their own
``__iter__``, the way code written for Megatron-Energon adds a data source or a wrapper.

Such a dataset is built with ``SavableDataset(worker_config)`` and follows the reference's protocol:
``__iter__`` runs in one worker and reads ``worker_config.rank_worker_id()`` to pick its share;
``save_state()`` / ``restore_state(state)`` save and restore the fields named in
``_savable_fields``; ``reset_state_own()`` sets them to their initial values.

energon runs it as logical streams, one per worker of the job (``world_size * max(1, num_workers)``,
fixed): stream ``s`` is worker ``s // world_size`` of rank ``s % world_size``, and whichever process
computes it, ``rank_worker_id()`` answers that worker. Each stream iterates its own copy of the
dataset (as each of the reference's workers does), and its state after every item is the copy's
``save_state()``, which must therefore be plain data. A restored stream calls ``restore_state`` on a
fresh copy and iterates it again, as the reference's workers do. :class:`HandWrittenKind` is what a
``SavableDataset`` of this kind asks where it differs from energon's planned datasets.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

from energon import state_fields as fields
from energon.errors import StateError
from energon.loader.dataset_kind import DatasetKind
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Item, Stage
from energon.pipeline.stream import Stream
from energon.savable import FlexState
from energon.worker import WorkerConfig

ITER = "Iter"  # the restore key of a hand-written item: ("Iter", item number); not rebuildable


def hand_written_spec(worker_config: WorkerConfig) -> PipelineSpec:
    """The spec of a hand-written dataset: no sources of energon's, one stream per worker, and a
    pass that ends when the dataset's iterators end (each loader pass starts them afresh)."""
    return PipelineSpec(
        sources=[],
        mode="hand-written",
        training=False,
        seed=worker_config.seed_offset,
        num_streams=worker_config.default_num_streams,
        num_streams_fixed=True,
        batch_size=None,
        repeat=False,
        even_ranks=False,
    )


@contextlib.contextmanager
def acting_as_worker(worker: int | None) -> Iterator[None]:
    """While inside, ``WorkerConfig.rank_worker_id()`` answers ``worker``."""
    previous = WorkerConfig.acting_worker
    WorkerConfig.acting_worker = worker
    try:
        yield
    finally:
        WorkerConfig.acting_worker = previous


def stream_worker(stream_id: int, world_size: int) -> int:
    """The local worker whose share logical stream ``stream_id`` of a hand-written dataset is."""
    return stream_id // world_size


def plain_state(value: Any, where: str) -> Any:
    """``value`` (a saved state) as plain data: dicts (``FlexState`` included), lists, tuples, str,
    int, float, bool, None. Anything else is a ``TypeError`` naming where it sits, because a
    stream's state is carried between processes and saved as data."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {key: plain_state(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain_state(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(
        f"{where} is a {type(value).__name__}: a hand-written dataset's save_state() must return "
        "plain data (dicts, lists, str, int, float, bool, None)"
    )


def as_flex_state(value: Any) -> Any:
    """A state read back from plain data, with its dicts as ``FlexState`` (as saved)."""
    if isinstance(value, dict):
        return FlexState({key: as_flex_state(item) for key, item in value.items()})
    if isinstance(value, list):
        return [as_flex_state(item) for item in value]
    return value


class IteratorStage(Stage):
    """One logical stream of a hand-written dataset: its own copy's ``__iter__``, run as the
    stream's worker."""

    def __init__(self, dataset: Any, worker: int) -> None:
        """``dataset``: a hand-written ``SavableDataset`` (energon.loader.savable_dataset)."""
        self.dataset = copy.deepcopy(dataset)
        self.worker = worker
        self.iterator: Iterator[Any] | None = None
        self.count = 0

    def next(self) -> Item:
        with acting_as_worker(self.worker):
            if self.iterator is None:
                self.iterator = iter(self.dataset)
            value = next(self.iterator)
        self.count += 1
        return value, (ITER, self.count - 1)

    def state(self) -> dict[str, Any]:
        name = type(self.dataset).__name__
        with acting_as_worker(self.worker):
            saved = self.dataset.save_state()
        return {"count": self.count, "dataset": plain_state(saved, f"{name}.save_state()")}

    def restore(self, state: dict[str, Any]) -> None:
        where = f"hand-written {type(self.dataset).__name__}"
        saved = fields.get(state, "dataset", where)
        count = fields.int_field(state, "count", where)
        with acting_as_worker(self.worker):
            self.dataset.restore_state(as_flex_state(saved))
        self.count = count
        self.iterator = None  # the next item comes from a fresh __iter__ over the restored fields

    def rebuild(self, key: tuple) -> Any:
        raise RuntimeError(
            f"{type(self.dataset).__name__} is a hand-written dataset: its items cannot be "
            "regenerated from a restore key (can_restore_sample() is False)"
        )


class HandWrittenKind(DatasetKind):
    """The kind of a dataset that yields its items from its own ``__iter__`` and saves its
    ``_savable_fields``: sizes come from its ``len_worker``, a logical stream is one of its workers
    (:class:`IteratorStage`), and its items cannot be regenerated from their keys."""

    # -- copies and sizes -------------------------------------------------------------------------
    def copy_fields(self, dataset: Any, clone: Any, memo: dict[int, Any]) -> None:
        """Every field but the spec and the worker config (which nothing changes): each stream's
        copy has its own fields, as each of the reference's workers has."""
        for name, value in vars(dataset).items():
            if name not in ("spec", "worker_config", "dataset_kind"):
                clone.__dict__[name] = copy.deepcopy(value, memo)

    def positions_per_pass(self, dataset: Any) -> int | None:
        return None  # the dataset's iterators decide

    def len_rank(self, dataset: Any) -> int:
        """The sum of its workers' ``len_worker``."""
        workers = range(max(1, dataset.worker_config.num_workers))
        return sum(dataset.len_worker(w) for w in workers)

    def len_worker(self, dataset: Any, worker_idx: int | None) -> int:
        raise NotImplementedError(
            f"{type(dataset).__name__}: a hand-written dataset defines len_worker "
            "(its items per worker)"
        )

    def fingerprint(self, dataset: Any) -> dict[str, Any]:
        """The class and its config."""
        return json.loads(json.dumps({type(dataset).__name__: dataset.config()}, default=str))

    # -- logical streams ------------------------------------------------------------------------
    def build_stream(self, dataset: Any, stream_id: int) -> Stream:
        worker = stream_worker(stream_id, dataset.worker_config.world_size)
        return Stream(stream_id, dataset.spec, [IteratorStage(dataset, worker)])

    def check_snapshot(self, dataset: Any, stream_id: int, snapshot: StreamSnapshot) -> None:
        """Nothing here: its own ``restore_state`` checks its fields when a worker restores the
        stream."""

    def can_restore_sample(self, dataset: Any) -> bool:
        return False

    def leaf_length(self, dataset: Any, stream: int, num_streams: int) -> int:
        """Its ``len_worker`` of the worker that the stream is."""
        return dataset.len_worker(stream_worker(stream, dataset.worker_config.world_size))

    def leaf_stage(self, dataset: Any, stream: int, num_streams: int, seed: int) -> Stage:
        """The stream's worker iterating its own copy (its streams are fixed: one per worker)."""
        return IteratorStage(dataset, stream_worker(stream, dataset.worker_config.world_size))

    # -- iterating without a loader, and the reference's per-dataset state protocol ------------
    def iterate(self, dataset: Any) -> Iterator[Any]:
        raise TypeError(f"{type(dataset).__name__}: a hand-written SavableDataset defines __iter__")

    def save_state(self, dataset: Any) -> FlexState:
        """A deep copy of each of its ``_savable_fields``."""
        state = FlexState(__class__=type(dataset).__name__)
        state.update({f: copy.deepcopy(getattr(dataset, f)) for f in dataset._savable_fields})
        return state

    def restore_state(self, dataset: Any, state: FlexState) -> None:
        for field in dataset._savable_fields:
            if field not in state:
                raise StateError(
                    f"{type(dataset).__name__}.restore_state: the state has no field {field!r}"
                )
            setattr(dataset, field, copy.deepcopy(state[field]))

    def reset_state_own(self, dataset: Any) -> None:
        """Nothing here: a hand-written dataset sets its fields in its own ``reset_state_own``."""


#: The one kind of hand-written leaves (a kind holds no state).
HAND_WRITTEN = HandWrittenKind()
