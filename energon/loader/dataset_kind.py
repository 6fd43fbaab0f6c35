"""``DatasetKind``: what differs between the two kinds of ``SavableDataset``.

A dataset is either *planned* (energon's own: ``get_train_dataset`` / ``get_val_dataset``, a
factory's ``build()``, a composition of the reference's wrappers), whose items, sizes and state
come from its :class:`~energon.pipeline.spec.PipelineSpec` (:mod:`energon.loader.planned`); or
*hand-written* (a user's subclass of the reference's ``SavableDataset(worker_config)`` or
``BaseWrapperDataset`` with its own ``__iter__`` and ``_savable_fields``), which energon runs as
one logical stream per worker (:mod:`energon.loader.hand_written`).

The kind is chosen once, when the dataset is made, and every method in which the two kinds
differ delegates to it, so each kind reads top to bottom in one class instead of one ``if`` per
method of the dataset. A kind holds no state: each method is told the dataset it acts for (typed
``Any``, because the dataset's module builds on this one).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.stage import Stage
from energon.pipeline.stream import Stream
from energon.savable import FlexState


class DatasetKind(abc.ABC):
    """How a dataset of one kind is sized, run as logical streams, iterated without a loader and
    saved by the reference's per-dataset state protocol. ``dataset`` is always a
    :class:`~energon.loader.savable_dataset.SavableDataset` of this kind."""

    # -- copies and sizes -------------------------------------------------------------------------
    @abc.abstractmethod
    def copy_fields(self, dataset: Any, clone: Any, memo: dict[int, Any]) -> None:
        """Deep-copy into ``clone`` (a shallow copy of ``dataset``) what ``copy.deepcopy`` must not
        share between the two."""

    @abc.abstractmethod
    def positions_per_pass(self, dataset: Any) -> int | None:
        """Global micro-batches in one pass, or None where the dataset's iterators decide."""

    @abc.abstractmethod
    def len_rank(self, dataset: Any) -> int:
        """Micro-batches the dataset's rank yields per pass."""

    @abc.abstractmethod
    def len_worker(self, dataset: Any, worker_idx: int | None) -> int:
        """Items one local worker yields per pass."""

    @abc.abstractmethod
    def fingerprint(self, dataset: Any) -> dict[str, Any]:
        """What a saved state depends on (JSON-able), checked when a state is restored."""

    # -- logical streams ------------------------------------------------------------------------
    @abc.abstractmethod
    def build_stream(self, dataset: Any, stream_id: int) -> Stream:
        """The stage chain of logical stream ``stream_id`` when a loader runs the dataset."""

    @abc.abstractmethod
    def check_snapshot(self, dataset: Any, stream_id: int, snapshot: StreamSnapshot) -> None:
        """Check a saved stream snapshot without reading data (``StateError`` naming the field)."""

    @abc.abstractmethod
    def can_restore_sample(self, dataset: Any) -> bool:
        """Whether items can be regenerated from their restore keys (``restore_sample``)."""

    @abc.abstractmethod
    def leaf_length(self, dataset: Any, stream: int, num_streams: int) -> int:
        """Items the dataset yields per pass on logical stream ``stream`` of ``num_streams``, as
        a leaf of a composition (:mod:`energon.compat.wrappers`; never asked of a wrapper)."""

    @abc.abstractmethod
    def leaf_stage(self, dataset: Any, stream: int, num_streams: int, seed: int) -> Stage:
        """The stage that yields logical stream ``stream`` of ``num_streams`` as a leaf of a
        composition, ``seed`` being the seed of this pass over the leaf (a composition that
        repeats a finite leaf reshuffles it each pass; never asked of a wrapper)."""

    # -- iterating without a loader, and the reference's per-dataset state protocol ------------
    @abc.abstractmethod
    def iterate(self, dataset: Any) -> Iterator[Any]:
        """What ``iter(dataset)`` yields when the dataset's class does not define ``__iter__``."""

    @abc.abstractmethod
    def save_state(self, dataset: Any) -> FlexState:
        """The dataset's state (``__class__`` and what this kind saves), as plain data."""

    @abc.abstractmethod
    def restore_state(self, dataset: Any, state: FlexState) -> None:
        """Continue from ``state``, a state of the dataset's class (checked by the caller)."""

    @abc.abstractmethod
    def reset_state_own(self, dataset: Any) -> None:
        """Back to the initial state of what this kind keeps."""
