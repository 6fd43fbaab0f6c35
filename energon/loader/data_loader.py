"""The loaders: ``get_loader`` / ``get_savable_loader`` and the :class:`Loader` they return.

A loader hands this rank its micro-batches in global-plan order. With workers, torch's DataLoader
collects worker ``w``'s results in strict round-robin, and worker ``w`` produces exactly the rank's
positions ``w, w + W, ...``, so the order is the plan's. Every yielded item comes with the snapshot of
its stream, so saving the state is copying a few small dicts: nothing is paused and nothing replayed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from energon.errors import StateError
from energon.loader.savable_dataset import ResumePoint, SavableDataset
from energon.memory.batch_arena import BatchArena, arena_supported
from energon.pipeline import snapshot
from energon.pipeline.executor import ItemMeta
from energon.pipeline.keys import Key, attach_restore_key, parse_stream_key, stream_key
from energon.pipeline.snapshot import StreamSnapshot
from energon.pipeline.stage import Value
from energon.state import (
    check_compatible,
    check_state_shape,
    make_rank_state,
    redistribute_states,
    stream_snapshots,
    upgrade_state,
)
from energon.task_encoder.base import hook_context
from energon.worker import WorkerConfig


def _collate(arena: BatchArena | None, item: tuple[Value, ItemMeta]) -> tuple[Value, ItemMeta]:
    """Runs in the worker: numpy -> tensors, and arena tensors -> small references."""
    value, meta = item
    value = torch.utils.data.default_convert(value)
    if arena is not None:
        value, meta.arena = arena.export(value)
    return value, meta


class _WorkerItems(torch.utils.data.IterableDataset):
    """What a loader worker iterates: its share of the rank's items, with their stream snapshots."""

    def __init__(self, dataset: SavableDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        return self.dataset.worker_items()


class Loader:
    """Iterates a :class:`SavableDataset` for this rank and tracks its exact position.

    ``for batch in loader`` yields one pass: ``virtual_epoch_length`` batches (training with a
    virtual epoch), the whole validation split (or ``limit`` batches), or forever (training). A new
    ``for`` loop over a training loader continues where the last one stopped; over a validation
    loader it starts the next pass from the beginning.
    """

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        worker_config: WorkerConfig | None = None,
        prefetch_factor: int | None = None,
        **compat_kwargs: Any,
    ) -> None:
        if not isinstance(dataset, SavableDataset):
            raise TypeError("the loader needs a dataset from get_train_dataset / get_val_dataset")
        if worker_config is not None:
            if worker_config != dataset.worker_config:
                raise ValueError(
                    "worker_config differs from the dataset's; the dataset's worker_config is used "
                    "(this argument is deprecated)"
                )
            warnings.warn(
                "the loader's worker_config argument is deprecated", FutureWarning, stacklevel=3
            )
        self.dataset = dataset
        self.worker_config = dataset.worker_config
        self.prefetch_factor = prefetch_factor or self.worker_config.prefetch_factor
        self._compat_kwargs = compat_kwargs
        self.cache_pool = compat_kwargs.get("cache_pool")
        self._origin = 0
        self._consumed = 0
        self._pass_offset = 0
        self._snapshots: dict[int, StreamSnapshot] = {}
        self._source: Iterator[tuple[Value, ItemMeta]] | None = None
        self._arena: BatchArena | None = None

    # -- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.dataset.len_rank()

    def __iter__(self) -> Iterator[Value]:
        return self._one_pass()

    def _pass_length(self) -> int | None:
        spec = self.dataset.spec
        if spec.training:
            return spec.virtual_epoch_length or None
        return spec.limit or None

    def _one_pass(self) -> Iterator[Value]:
        length = self._pass_length()
        if self._source is None:
            self._source = self._open_source()
        while length is None or self._pass_offset < length:
            try:
                value, meta = next(self._source)
            except StopIteration:
                self._finish_pass()
                return
            self._record(meta)
            if meta.arena:
                value = self._arena.import_(value)
            yield value
        self._pass_offset = 0
        if not self.dataset.spec.training:
            self._finish_pass()

    def _finish_pass(self) -> None:
        """After a finite pass (validation, or training with repeat=False) the next starts afresh."""
        self._close_source()
        self._origin = self._consumed = self._pass_offset = 0
        self._snapshots = {}

    def _record(self, meta: ItemMeta) -> None:
        wc = self.worker_config
        self._snapshots[meta.stream] = meta.snapshot
        self._consumed = (meta.position - self._origin - wc.rank) // wc.world_size + 1
        self._pass_offset += 1

    def _open_source(self) -> Iterator[tuple[Value, ItemMeta]]:
        wc = self.worker_config
        hook_context.cache_pool = self.cache_pool  # workers inherit it through fork
        self.dataset.resume = ResumePoint(
            base=self._origin + self._consumed * wc.world_size,
            snapshots=dict(self._snapshots),
        )
        if wc.num_workers == 0:
            self.dataset.arena = None
            return iter(self.dataset.executor(0))
        self._arena = BatchArena(wc.num_workers) if arena_supported() else None
        self.dataset.arena = self._arena
        generator = torch.Generator()
        generator.manual_seed(0)  # torch draws worker base seeds from it, not from the global RNG
        loader = torch.utils.data.DataLoader(
            _WorkerItems(self.dataset),
            batch_size=None,
            num_workers=wc.num_workers,
            collate_fn=functools.partial(_collate, self._arena),
            prefetch_factor=self.prefetch_factor,
            persistent_workers=False,
            multiprocessing_context="fork",
            pin_memory=torch.cuda.is_available(),
            generator=generator,
        )
        return iter(loader)

    def _close_source(self) -> None:
        source, self._source = self._source, None
        shutdown = getattr(source, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if self._arena is not None:
            self._arena.close()

    def __del__(self) -> None:
        try:
            self._close_source()
        except Exception:
            pass

    # -- state -------------------------------------------------------------------------------
    def save_state_rank(self) -> dict[str, Any]:
        """This rank's position as plain data (JSON-serialisable; safe for ``torch.load``)."""
        fp, digest = self.dataset.fingerprint()
        spec = self.dataset.spec
        state = make_rank_state(
            fingerprint=fp,
            fingerprint_digest=digest,
            num_streams=spec.num_streams,
            world_size=self.worker_config.world_size,
            rank=self.worker_config.rank,
            origin=self._origin,
            consumed=self._consumed,
            pass_offset=self._pass_offset,
            streams=self._snapshots,
            micro_batch_size=spec.batch_size,
        )
        return json.loads(json.dumps(state))

    def restore_state_rank(self, state: dict[str, Any] | None) -> None:
        """Continue exactly where ``state`` was saved. Call before iterating."""
        if state is None:
            return
        if self._source is not None:
            raise StateError("restore_state_rank must be called before iterating the loader")
        state = check_state_shape(state)
        fp, digest = self.dataset.fingerprint()
        check_compatible(state, fp, digest)
        state = upgrade_state(state, self.dataset.spec.pointer_kinds())
        wc = self.worker_config
        if (state["rank"], state["world_size"]) != (wc.rank, wc.world_size):
            raise StateError(
                f"this state was saved by rank {state['rank']} of {state['world_size']}, but this "
                f"loader is rank {wc.rank} of {wc.world_size}: use restore_state_global(states) or "
                "energon.redistribute_states(states, new_world_size)"
            )
        self._set_num_streams(state["num_streams"])
        self._origin = state["origin"]
        self._consumed = state["consumed"]
        self._pass_offset = state["pass_offset"]
        self._snapshots = copy.deepcopy(stream_snapshots(state))

    def _set_num_streams(self, num_streams: int) -> None:
        spec = self.dataset.spec
        if num_streams == spec.num_streams:
            return
        if spec.num_streams_fixed:
            raise StateError(
                f"the state uses {num_streams} logical streams but num_streams={spec.num_streams} was given"
            )
        self.dataset.spec = dataclasses.replace(spec, num_streams=num_streams)

    def save_state_global(self, global_dst_rank: int | None = None, **kwargs: Any) -> list | None:
        """Gather every data-parallel rank's state on ``global_dst_rank`` (all ranks must call)."""
        if global_dst_rank is None:
            global_dst_rank = kwargs.pop("dst_rank", 0)
        state = self.save_state_rank()
        if self.worker_config.world_size == 1:
            return [state]
        import torch.distributed as dist

        group = self.worker_config.data_parallel_group
        gathered = (
            [None] * self.worker_config.world_size if dist.get_rank() == global_dst_rank else None
        )
        dist.gather_object(state, gathered, dst=global_dst_rank, group=group)
        return gathered

    def restore_state_global(self, state: list | None, *, src_rank: int | None = None) -> None:
        """Restore from the list of all ranks' states, on any number of ranks (all must call)."""
        wc = self.worker_config
        if src_rank is not None and wc.world_size > 1:
            import torch.distributed as dist

            received = [None]
            scatter = None
            if dist.get_rank() == src_rank:
                scatter = self._states_for_this_world(state)
            dist.scatter_object_list(received, scatter, src=src_rank, group=wc.data_parallel_group)
            self.restore_state_rank(received[0])
            return
        if state is None:
            return
        self.restore_state_rank(self._states_for_this_world(state)[wc.rank])

    def _states_for_this_world(self, states: list) -> list:
        states = [check_state_shape(s) for s in states]
        world = self.worker_config.world_size
        if len(states) == world and all(s["world_size"] == world for s in states):
            return sorted(states, key=lambda s: s["rank"])
        return redistribute_states(states, world)

    def blend_report(self) -> list[dict[str, Any]]:
        """Requested weight vs. observed share of each source, over the samples this rank's
        streams have read so far (samples waiting in shuffle buffers count as read)."""
        spec = self.dataset.spec
        consumed = [0] * len(spec.sources)
        for snap in self._snapshots.values():
            for i, read in enumerate(snapshot.samples_read(snap)):
                consumed[i] += read
        total = sum(consumed) or 1
        return [
            {
                "path": source.leaf.fingerprint()["path"],
                "split_part": source.leaf.split_part,
                "weight": source.weight if spec.mode == "weight" else None,
                "repetitions": source.repetitions if spec.mode == "repetitions" else None,
                "consumed": count,
                "observed": count / total,
            }
            for source, count in zip(spec.sources, consumed)
        ]

    # -- debugging ---------------------------------------------------------------------------
    def can_restore_sample(self) -> bool:
        return self.dataset.can_restore_sample()

    def restore_sample(self, restore_key: Key) -> Value:
        """Regenerate a yielded item from its ``__restore_key__`` (pure hooks only)."""
        if not self.can_restore_sample():
            raise RuntimeError(
                "restore_sample needs @stateless hooks (encode_sample, encode_batch, map functions)"
            )
        stream_id, key = parse_stream_key(restore_key)
        if not 0 <= stream_id < self.dataset.spec.num_streams:
            raise ValueError(
                f"restore key {restore_key!r} names stream {stream_id}, but this loader has "
                f"{self.dataset.spec.num_streams} logical streams"
            )
        value = self.dataset.build_stream(stream_id).rebuild(key)
        attach_restore_key(value, stream_key(stream_id, key))
        return value

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "num_workers": self.worker_config.num_workers,
            "prefetch_factor": self.prefetch_factor if self.worker_config.num_workers else None,
            "dataset": self.dataset.config(),
        }


class BasicDataLoader(Loader):
    """The loader of ``get_loader``; it can save and restore its position too."""


class SavableDataLoader(Loader):
    """The loader of ``get_savable_loader``."""


def get_loader(
    dataset: SavableDataset, *, worker_config: WorkerConfig | None = None, **kwargs: Any
) -> BasicDataLoader:
    """A loader over ``dataset`` with ``worker_config.num_workers`` worker processes."""
    return BasicDataLoader(dataset, worker_config=worker_config, **kwargs)


def get_savable_loader(
    dataset: SavableDataset, *, worker_config: WorkerConfig | None = None, **kwargs: Any
) -> SavableDataLoader:
    """A loader whose exact position can be saved (``save_state_rank``) and restored.

    The reference's ``checkpoint_every_sec`` / ``n_checkpoints`` tuning knobs are accepted and have
    nothing to tune here: every yielded batch carries its own restore point.
    """
    return SavableDataLoader(dataset, worker_config=worker_config, **kwargs)
