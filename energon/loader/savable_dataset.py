"""``SavableDataset``: what ``get_train_dataset`` / ``get_val_dataset`` return.

It is a ``torch.utils.data.IterableDataset``. A loader executes the rank's micro-batch positions
through :meth:`SavableDataset.executor` (one per worker), which yields ``(item, meta)`` pairs; the
loader strips ``meta`` (an :class:`~energon.pipeline.executor.ItemMeta`: position, stream and the
stream's snapshot after the item) and keeps the snapshot for saving state. A dataset holds no loader
state: where a loader resumes is the loader's own :class:`ResumePoint`, so any number of loaders can
share one dataset object.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch.utils.data

from energon.errors import SkipSample, StateError
from energon.loader.dataset_kind import DatasetKind
from energon.loader.hand_written import HAND_WRITTEN, hand_written_spec
from energon.loader.planned import PLANNED
from energon.loader.resume_point import ResumePoint
from energon.pipeline.balanced_executor import BalancedExecutor
from energon.pipeline.executor import Executor
from energon.pipeline.keys import as_key, attach_restore_key, parse_stream_key
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.pipeline.stream import Stream
from energon.savable import FlexState, Savable
from energon.worker import Layout, WorkerConfig


class SavableDataset(torch.utils.data.IterableDataset, Savable):
    """A loader-ready dataset: a pipeline spec plus the worker config it was built for.

    Built by ``SavableDataset(worker_config)`` (the reference's signature), it is the base of a
    *hand-written* dataset that yields its items from its own ``__iter__``
    (:mod:`energon.loader.hand_written`); energon's own, *planned* datasets are made by
    :meth:`from_spec` (:mod:`energon.loader.planned`). Where the two kinds differ, a method asks
    the dataset's :attr:`dataset_kind` (:class:`~energon.loader.dataset_kind.DatasetKind`), chosen
    once when the dataset is made. Either kind also answers the reference's per-dataset state
    protocol (:meth:`save_state`, :meth:`restore_state`, :meth:`reset_state_own`,
    :meth:`reset_state_deep`): a hand-written dataset saves its ``_savable_fields``; a planned one
    saves where its own ``__iter__`` (iterating it without a loader) has got to. Loaders use
    neither: they keep the state of the logical streams they run themselves.
    """

    #: A hand-written dataset's fields that ``save_state`` saves and ``restore_state`` sets.
    _savable_fields: tuple[str, ...] = ()

    def __init__(self, worker_config: WorkerConfig) -> None:
        """The base of a hand-written dataset (the reference's constructor); energon's own
        datasets are made by :meth:`from_spec`."""
        self._setup(worker_config, HAND_WRITTEN, None)

    @classmethod
    def from_spec(cls, spec: PipelineSpec, worker_config: WorkerConfig) -> SavableDataset:
        """The dataset that runs ``spec`` for ``worker_config``'s ranks and workers."""
        dataset = cls.__new__(cls)
        dataset._setup(worker_config, PLANNED, spec)
        return dataset

    def _setup(
        self, worker_config: WorkerConfig, kind: DatasetKind, spec: PipelineSpec | None
    ) -> None:
        """``spec`` None: a hand-written dataset's (no sources of energon's, one stream per
        worker)."""
        if not isinstance(worker_config, WorkerConfig):
            raise TypeError(
                f"{type(self).__name__}: worker_config must be a WorkerConfig, "
                f"not {type(worker_config).__name__}"
            )
        self.dataset_kind = kind
        self.spec = hand_written_spec(worker_config) if spec is None else spec
        self.worker_config = worker_config
        self.journal_keys = False  # items carry their restore keys (a loader keeps a journal)
        self._direct: dict[str, Any] | None = None  # where __iter__ has got to (save_state)

    def __deepcopy__(self, memo: dict[int, Any]) -> SavableDataset:
        """A copy that shares what its kind says nothing changes (a planned dataset's spec); a
        hand-written one's copy has its own fields, as each of the reference's workers has."""
        clone = copy.copy(self)
        memo[id(self)] = clone
        self.dataset_kind.copy_fields(self, clone, memo)
        return clone

    def with_spec(self, spec: PipelineSpec) -> SavableDataset:
        """A copy of this dataset that runs ``spec`` (this object is left as it is)."""
        clone = copy.copy(self)
        clone.spec = spec
        return clone

    def with_num_workers(self, num_workers: int) -> SavableDataset:
        """A copy of this dataset whose ranks run ``num_workers`` workers each (its logical streams
        stay as they are: the same batches in the same order, computed by other workers)."""
        clone = copy.copy(self)
        clone.worker_config = dataclasses.replace(self.worker_config, num_workers=num_workers)
        return clone

    # -- sizes -------------------------------------------------------------------------------
    def positions_per_pass(self) -> int | None:
        """Global micro-batches in one pass (validation, as planned from the sample counts), or
        per epoch (training); None: a hand-written dataset's iterators decide."""
        return self.dataset_kind.positions_per_pass(self)

    def len_rank(self) -> int:
        """Micro-batches this rank yields per pass (``limit`` / ``virtual_epoch_length`` if set);
        a hand-written dataset's: the sum of its workers' ``len_worker``."""
        return self.dataset_kind.len_rank(self)

    def len_ranks(self, ranks: Iterable[int]) -> list[int]:
        """:meth:`len_rank` of each of ``ranks`` of this world size: the same arithmetic, with the
        pass's positions counted once (``energon simulate`` asks it of thousands of ranks; the
        spec does not depend on the rank)."""
        spec = self.spec
        ranks = list(ranks)
        if spec.limit is not None and (spec.training or spec.repeat):
            return [spec.limit] * len(ranks)  # the data never runs out
        if spec.training and spec.virtual_epoch_length:
            return [spec.virtual_epoch_length] * len(ranks)
        total = self.positions_per_pass() or 0
        world = self.worker_config.world_size
        if spec.planned_validation or spec.balance is not None:
            # every rank the same: holes (or balanced steps) keep them even
            counts = [-(-total // world)] * len(ranks)
        else:
            counts = [len(range(rank, total, world)) for rank in ranks]
        if spec.limit is not None:
            counts = [min(count, spec.limit) for count in counts]
        return counts

    def __len__(self) -> int:
        return self.len_rank()

    def fingerprint(self) -> tuple[dict[str, Any], str]:
        """What a saved state depends on (a hand-written dataset's: its class and config), and
        its digest."""
        fp = self.dataset_kind.fingerprint(self)
        return fp, fingerprint_digest(fp)

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "worker_config": self.worker_config.config(),
            **self.spec.config(),
        }

    # -- execution ---------------------------------------------------------------------------
    def layout(self, worker: int = 0, base: int = 0) -> Layout:
        """Which positions worker ``worker`` of this rank executes, from ``base`` on."""
        wc = self.worker_config
        return Layout(
            num_streams=self.spec.num_streams,
            world_size=wc.world_size,
            rank=wc.rank,
            num_workers=max(1, wc.num_workers),
            worker=worker,
            base=base,
        )

    def pass_end(self, base: int = 0) -> int | None:
        """First global position after a finite pass whose length is planned (planned validation,
        or training with repeat=False), for a rank that resumes at ``base``; None: streams end by
        themselves (validation whose counts depend on the data) or never.

        Planned validation rounds the end up so that every rank has as many positions left from
        ``base`` on; the positions beyond the plan are holes that the loader fills.
        """
        spec = self.spec
        if spec.planned_validation:
            planned = spec.num_streams * spec.val_batches_per_stream()
            world = self.worker_config.world_size
            return base + world * -(-max(0, planned - base) // world)
        if not spec.training:
            return None
        if spec.repeat or spec.mode == "weight":
            return None
        return spec.num_streams * max(spec.batches_of(c) for c in spec.stream_sample_counts())

    def build_stream(self, stream_id: int) -> Stream:
        """The stage chain of one logical stream (datasets composed otherwise override this)."""
        return self.dataset_kind.build_stream(self, stream_id)

    def initial_snapshot(self, stream_id: int) -> StreamSnapshot:
        """The snapshot of stream ``stream_id`` before its first item (no data is read)."""
        if self.spec.balance is not None:
            return self.executor(0, all_workers=True).stream(stream_id).state()
        return self.build_stream(stream_id).state()

    def check_snapshot(self, stream_id: int, snapshot: StreamSnapshot) -> None:
        """Check a saved stream snapshot without reading data (``StateError`` naming the field)."""
        self.dataset_kind.check_snapshot(self, stream_id, snapshot)

    def can_restore_sample(self) -> bool:
        """Whether ``restore_sample`` can regenerate items: every active hook is ``@stateless``
        (a hand-written dataset's items cannot be regenerated)."""
        return self.dataset_kind.can_restore_sample(self)

    def assert_can_restore(self) -> None:
        if not self.can_restore_sample():
            raise RuntimeError(
                "restore_sample needs @stateless hooks (encode_sample, encode_batch, map functions)"
            )

    def restore_sample(self, restore_key: Any) -> Any:
        """Regenerate an item this dataset yielded from its ``__restore_key__`` (see
        :func:`restore_item`; errors go to this dataset's ``restore_error_handler``)."""
        return restore_item(self, restore_key, self.worker_config.restore_error_handler)

    def len_worker(self, worker_idx: int | None = None) -> int:
        """Items one local worker yields per pass (the rank's items go round-robin to them; a
        hand-written dataset defines its own)."""
        return self.dataset_kind.len_worker(self, worker_idx)

    def worker_has_samples(self) -> bool:
        return self.len_rank() > 0

    def executor(
        self, worker: int, resume: ResumePoint | None = None, *, all_workers: bool = False
    ) -> Executor | BalancedExecutor:
        """Worker ``worker``'s executor of this rank's positions, resuming at ``resume``
        (``all_workers``: one executor of all the rank's positions, as without workers)."""
        resume = resume or ResumePoint()
        layout = self.layout(worker, resume.base)
        if all_workers:
            layout = dataclasses.replace(layout, num_workers=1, worker=0)
        if self.spec.balance is not None:
            return BalancedExecutor(
                self.spec,
                layout,
                resume.snapshots,
                end=self.pass_end(resume.base),
                origin=resume.origin,
                tail=resume.tail,
            )
        return Executor(
            self.spec,
            layout,
            resume.snapshots,
            end=self.pass_end(resume.base),
            build=self.build_stream,
            keys=self.journal_keys,
            fill_to_end=self.spec.planned_validation,
            board=resume.board,
        )

    def __iter__(self) -> Iterator[Any]:
        """Iterating a dataset without a loader (as the reference allows) yields this rank's items
        in order, computed in this process: one pass, ``virtual_epoch_length`` / ``limit`` items,
        or forever (training); inside a hand-written dataset's stream or a torch ``DataLoader``
        worker, only that worker's items. Holes of a planned validation pass are left out: only a
        loader fills them (its ``__padding__`` fillers keep ranks even). It continues from the
        position ``save_state`` gives (:mod:`energon.loader.direct_iteration`). A hand-written
        dataset defines its own (this one raises at the first item, as a generator)."""
        yield from self.dataset_kind.iterate(self)

    # -- the reference's per-dataset state protocol -------------------------------------------
    def save_state(self) -> FlexState:
        """A hand-written dataset's ``_savable_fields``; a planned dataset's iteration position."""
        return self.dataset_kind.save_state(self)

    def restore_state(self, state: FlexState) -> None:
        """Continue as the dataset that saved ``state`` (its :meth:`save_state`) would have; a
        state of another class is refused before anything is restored."""
        name = type(self).__name__
        if not isinstance(state, dict) or state.get("__class__") != name:
            got = state.get("__class__") if isinstance(state, dict) else type(state).__name__
            raise StateError(f"{name}.restore_state: the state was saved by {got}, not by {name}")
        self.dataset_kind.restore_state(self, state)

    def reset_state_own(self) -> None:
        """Back to the initial state (a hand-written dataset sets its fields here)."""
        self.dataset_kind.reset_state_own(self)

    def reset_state_deep(self) -> None:
        """:meth:`reset_state_own` of this dataset and everything it wraps."""
        self.reset_state_own()


def restore_item(dataset: SavableDataset, restore_key: Any, error_handler: Any) -> Any:
    """Regenerate an item of ``dataset`` from its ``__restore_key__`` (pure hooks only).

    The hooks see the same ``current_sample_index`` / ``current_batch_index`` as when the item
    was first made. Errors go to ``error_handler(error, restore_key, None)`` (the default
    handler re-raises); a handler that does not raise makes this return None.
    """
    dataset.assert_can_restore()
    stream_id, item_index, key = parse_stream_key(restore_key)
    streams = dataset.spec.num_streams
    if not 0 <= stream_id < streams:
        raise ValueError(
            f"restore key {restore_key!r} names stream {stream_id}, but this dataset has "
            f"{streams} logical streams"
        )
    try:
        value = dataset.build_stream(stream_id).rebuild(key, item_index)
    except SkipSample as e:
        error = ValueError(f"unexpected SkipSample while restoring {restore_key!r}: {e}")
        error_handler(error, restore_key, None)
        return None
    except Exception as e:
        error_handler(e, restore_key, None)
        return None
    attach_restore_key(value, as_key(restore_key))
    return value
