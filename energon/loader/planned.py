"""Planned datasets: energon's own, whose items, sizes and state come from their pipeline spec.

``get_train_dataset`` / ``get_val_dataset`` and a factory's ``build()`` make them
(``SavableDataset.from_spec``). Their sizes are arithmetic over the plan's sample counts, a loader
runs their logical streams through :func:`energon.pipeline.stream.build_stream`, and iterating one
without a loader runs the same executors in this process, with the position it has got to saved by
the reference's per-dataset state protocol (:mod:`energon.loader.direct_iteration`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from energon.loader.dataset_kind import DatasetKind
from energon.loader.direct_iteration import DirectPosition
from energon.loader.resume_point import ResumePoint
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stage import Stage
from energon.pipeline.stream import Stream, build_stream, restore_stages
from energon.savable import FlexState
from energon.worker import WorkerConfig


class PlannedKind(DatasetKind):
    """The kind of a dataset that runs its spec (``dataset.spec``)."""

    # -- copies and sizes -------------------------------------------------------------------------
    def copy_fields(self, dataset: Any, clone: Any, memo: dict[int, Any]) -> None:
        """Nothing: a copy shares the spec, which nothing changes."""

    def positions_per_pass(self, dataset: Any) -> int | None:
        """Planned from the sample counts: one validation pass, or one training epoch."""
        spec = dataset.spec
        if not spec.training and not spec.even_ranks:
            return sum(spec.stream_val_batches(s) for s in range(spec.num_streams))
        if not spec.training:
            return spec.num_streams * spec.val_batches_per_stream()
        return sum(spec.batches_of(c) for c in spec.stream_sample_counts())

    def len_rank(self, dataset: Any) -> int:
        return dataset.len_ranks([dataset.worker_config.rank])[0]

    def len_worker(self, dataset: Any, worker_idx: int | None) -> int:
        """The rank's items go round-robin to its local workers."""
        workers = max(1, dataset.worker_config.num_workers)
        return len(range(worker_idx or 0, dataset.len_rank(), workers))

    def fingerprint(self, dataset: Any) -> dict[str, Any]:
        return dataset.spec.fingerprint()

    # -- logical streams ------------------------------------------------------------------------
    def build_stream(self, dataset: Any, stream_id: int) -> Stream:
        return build_stream(dataset.spec, stream_id)

    def check_snapshot(self, dataset: Any, stream_id: int, snapshot: StreamSnapshot) -> None:
        """The pointer stages are built and restored (no I/O); the stages behind them check their
        part when a worker restores the stream."""
        restore_stages(
            build_pointer_stages(dataset.spec, stream_id), snapshot, stream_id, complete=False
        )

    def can_restore_sample(self, dataset: Any) -> bool:
        """Every active hook is ``@stateless``."""
        te = dataset.spec.task_encoder
        for hook in ("encode_sample", "encode_batch"):
            if te.is_active(hook) and not getattr(getattr(te, hook), "__stateless__", False):
                return False
        return True

    def leaf_length(self, dataset: Any, stream: int, num_streams: int) -> int:
        """The reference's ``len_worker`` of one stream, from the plan's counts."""
        spec = _with_streams(dataset.spec, num_streams)
        if not spec.training:
            return spec.stream_val_batches(stream)
        return spec.batches_of(spec.stream_sample_count(stream))

    def leaf_stage(self, dataset: Any, stream: int, num_streams: int, seed: int) -> Stage:
        spec = _with_streams(dataset.spec, num_streams)
        if seed != spec.seed:
            spec = dataclasses.replace(spec, seed=seed)
        return build_stream(spec, stream)

    # -- iterating without a loader, and the reference's per-dataset state protocol ------------
    def iterate(self, dataset: Any) -> Iterator[Any]:
        """This rank's items in order, computed in this process (inside a hand-written dataset's
        stream or a torch ``DataLoader`` worker: only that worker's), continuing from the
        position :meth:`save_state` gives. Holes of a planned validation pass are left out:
        only a loader fills them."""
        spec = dataset.spec
        length = spec.virtual_epoch_length if spec.training else spec.limit
        worker = WorkerConfig.acting_worker
        info = torch.utils.data.get_worker_info()
        if worker is None and info is not None:  # a torch DataLoader's worker: its share only
            dataset.worker_config.assert_worker()  # as many workers as the config says
            worker = info.id
        position = DirectPosition.from_state(dataset._direct, f"{type(dataset).__name__} state")
        resume = ResumePoint(base=position.base, snapshots=dict(position.snapshots))
        executor = dataset.executor(worker or 0, resume, all_workers=worker is None)
        layout = executor.layout
        for value, meta in executor:
            if length and position.emitted >= length:
                return
            counted = not (meta.hole or meta.ended)
            position = position.advance(meta, layout, counted)
            dataset._direct = position.to_state()
            if counted:
                yield value

    def save_state(self, dataset: Any) -> FlexState:
        """Where iterating the dataset without a loader has got to."""
        return FlexState(__class__=type(dataset).__name__, position=dataset._direct)

    def restore_state(self, dataset: Any, state: FlexState) -> None:
        position = state.get("position")
        DirectPosition.from_state(position, f"{type(dataset).__name__} state")  # checked here
        dataset._direct = position

    def reset_state_own(self, dataset: Any) -> None:
        dataset._direct = None


def _with_streams(spec: PipelineSpec, num_streams: int) -> PipelineSpec:
    if spec.num_streams == num_streams:
        return spec
    return dataclasses.replace(spec, num_streams=num_streams)


#: The one planned kind (a kind holds no state).
PLANNED = PlannedKind()
