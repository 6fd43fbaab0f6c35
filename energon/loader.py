"""Building datasets and loaders: ``get_train_dataset``, ``get_val_dataset(s)``, ``get_loader``,
``get_savable_loader``.

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

from energon.batch_arena import BatchArena, arena_supported
from energon.dataset import ResumePoint, SavableDataset
from energon.errors import StateError
from energon.metadataset.resolve import resolve_dataset
from energon.pipeline.spec import PipelineSpec
from energon.pipeline.stages import as_key
from energon.pipeline.stream import build_stream
from energon.state import (
    check_compatible,
    check_state_shape,
    make_rank_state,
    redistribute_states,
    stream_snapshots,
)
from energon.task_encoder import DefaultTaskEncoder, TaskEncoder
from energon.worker import WorkerConfig

_DECODE_KWARGS = ("auto_decode", "image_decode", "av_decode", "video_decode_audio")


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------


def _apply_decode_kwargs(task_encoder: TaskEncoder, kwargs: dict[str, Any]) -> None:
    """The deprecated decoding kwargs become ``task_encoder.decoder``."""
    given = {k: kwargs.pop(k) for k in _DECODE_KWARGS if k in kwargs}
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn(
            "'handler' is deprecated and ignored; set WorkerConfig.global_error_handler instead",
            FutureWarning,
            stacklevel=3,
        )
    if not given:
        return
    warnings.warn(
        f"{sorted(given)} are deprecated; set task_encoder.decoder = SampleDecoder(...) instead",
        FutureWarning,
        stacklevel=3,
    )
    if given.pop("auto_decode", True) is False:
        task_encoder.decoder = None
        return
    from energon.decode import SampleDecoder

    task_encoder.decoder = SampleDecoder(**given)


def _build(
    path: Any,
    *,
    training: bool,
    split_part: str,
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool,
    packing_buffer_size: int | None,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    virtual_epoch_length: int,
    shuffle_over_epochs_multiplier: int | None,
    task_encoder: TaskEncoder | None,
    repeat: bool,
    limit: int | None,
    kwargs: dict[str, Any],
) -> SavableDataset:
    if not isinstance(worker_config, WorkerConfig):
        raise TypeError("worker_config must be an energon.WorkerConfig")
    if packing_buffer_size and not (
        task_encoder is not None
        and task_encoder.is_active("select_samples_to_pack")
        and task_encoder.is_active("pack_selected_samples")
    ):
        raise ValueError(
            "packing_buffer_size needs a task encoder with select_samples_to_pack and "
            "pack_selected_samples"
        )
    task_encoder = task_encoder if task_encoder is not None else DefaultTaskEncoder()
    kwargs = dict(kwargs)
    _apply_decode_kwargs(task_encoder, kwargs)
    num_streams = kwargs.pop("num_streams", None)
    group_max_wait = kwargs.pop("group_max_wait", None)
    parallel_shard_iters = kwargs.pop("parallel_shard_iters", None)
    sample_type = kwargs.pop("sample_type", None)
    resolved = resolve_dataset(
        path,
        split_part=split_part,
        training=training,
        subflavors=kwargs.pop("subflavors", None),
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier if training else None,
        dataset_config=kwargs.pop("dataset_config", None),
        split_config=kwargs.pop("split_config", None),
        token_config=kwargs.pop("token_config", None),
    )
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")
    _check_sample_type(resolved.sources, sample_type)
    if training and resolved.mode == "weight" and not repeat:
        raise ValueError("a weighted blend is infinite: use repeat=True (or blend_epochized)")
    if training and parallel_shard_iters not in (None, 1):
        if any(s.shuffle_over_epochs is None for s in resolved.sources):
            raise ValueError(
                "unshuffled training (shuffle_over_epochs_multiplier=None) reads one slice at a time"
            )
    spec = PipelineSpec(
        sources=resolved.sources,
        mode=resolved.mode,
        training=training,
        seed=worker_config.seed_offset,
        num_streams=num_streams or worker_config.default_num_streams,
        num_streams_fixed=num_streams is not None,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        shuffle_buffer_size=shuffle_buffer_size if training else None,
        max_samples_per_sequence=max_samples_per_sequence if training else None,
        parallel_shard_iters=parallel_shard_iters,
        repeat=repeat if training else False,
        task_encoder=task_encoder,
        decoder=task_encoder.decoder,
        error_handler=worker_config.global_error_handler,
        failure_tolerance=getattr(task_encoder, "__default_failure_tolerance__", 100),
        virtual_epoch_length=virtual_epoch_length if training else 0,
        limit=limit,
        packing_buffer_size=packing_buffer_size or None,
        group_max_wait=group_max_wait,
        even_ranks=worker_config.world_size > 1,
    )
    _check_streams_have_samples(spec)
    return SavableDataset(spec, worker_config)


def _check_sample_type(sources: list[Any], sample_type: type | None) -> None:
    if sample_type is None:
        return
    for source in sources:
        st = source.leaf.builder.sample_type
        if st is not None and not issubclass(st, sample_type):
            raise TypeError(f"{source.leaf.root} yields {st.__name__}, not {sample_type.__name__}")


def _check_streams_have_samples(spec: PipelineSpec) -> None:
    if not spec.training or not spec.repeat:
        return
    counts = spec.stream_sample_counts()
    if min(counts) == 0:
        raise ValueError(
            f"the dataset has {sum(counts)} samples, fewer than the {spec.num_streams} logical "
            "streams (world_size x num_workers): some streams would have nothing to read. Use fewer "
            "workers or pass num_streams=..."
        )


def get_train_dataset(
    path: Any,
    *,
    split_part: str = "train",
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    shuffle_buffer_size: int | None,
    max_samples_per_sequence: int | None,
    virtual_epoch_length: int = 0,
    shuffle_over_epochs_multiplier: int | None = 1,
    task_encoder: TaskEncoder | None = None,
    repeat: bool = True,
    **kwargs: Any,
) -> SavableDataset:
    """An infinite (``repeat=True``), reshuffled-every-epoch training dataset.

    ``batch_size``, ``shuffle_buffer_size`` and ``max_samples_per_sequence`` must be given (``None`` is
    allowed) so that the trade-off between randomness and read locality is a conscious choice.
    Extra keywords: ``num_streams`` (logical streams; default ``world_size * max(1, num_workers)``),
    ``parallel_shard_iters``, ``dataset_config``, ``split_config``, ``subflavors``.
    """
    return _build(
        path,
        training=True,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=shuffle_buffer_size,
        max_samples_per_sequence=max_samples_per_sequence,
        virtual_epoch_length=virtual_epoch_length,
        shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier,
        task_encoder=task_encoder,
        repeat=repeat,
        limit=None,
        kwargs=kwargs,
    )


def get_val_dataset(
    path: Any,
    *,
    split_part: str = "val",
    worker_config: WorkerConfig,
    batch_size: int | None,
    batch_drop_last: bool = False,
    packing_buffer_size: int | None = None,
    limit: int | None = None,
    task_encoder: TaskEncoder | None = None,
    **kwargs: Any,
) -> SavableDataset:
    """One deterministic pass over the split: every sample exactly once, the same batches every
    pass, and the same number of batches on every rank (see docs/ordering.md)."""
    return _build(
        path,
        training=False,
        split_part=split_part,
        worker_config=worker_config,
        batch_size=batch_size,
        batch_drop_last=batch_drop_last,
        packing_buffer_size=packing_buffer_size,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        virtual_epoch_length=0,
        shuffle_over_epochs_multiplier=None,
        task_encoder=task_encoder,
        repeat=False,
        limit=limit,
        kwargs=kwargs,
    )


def get_val_datasets(path: Any, **kwargs: Any) -> list[tuple[SavableDataset, Any]]:
    """One validation pipeline per leaf dataset, each with the source that describes it."""
    dataset = get_val_dataset(path, **kwargs)
    out = []
    for source in dataset.spec.sources:
        spec = dataclasses.replace(dataset.spec, sources=[source], mode="none")
        out.append((SavableDataset(spec, dataset.worker_config), source))
    return out


# ---------------------------------------------------------------------------------------------
# loaders
# ---------------------------------------------------------------------------------------------


def _collate(
    arena: BatchArena | None, item: tuple[Any, dict[str, Any]]
) -> tuple[Any, dict[str, Any]]:
    """Runs in the worker: numpy -> tensors, and arena tensors -> small references."""
    value, meta = item
    value = torch.utils.data.default_convert(value)
    if arena is not None:
        value, meta["arena"] = arena.export(value)
    return value, meta


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
        self._origin = 0
        self._consumed = 0
        self._pass_offset = 0
        self._snapshots: dict[int, dict[str, Any]] = {}
        self._source: Iterator | None = None
        self._arena: BatchArena | None = None

    # -- iteration ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.dataset.len_rank()

    def __iter__(self) -> Iterator[Any]:
        return self._one_pass()

    def _pass_length(self) -> int | None:
        spec = self.dataset.spec
        if spec.training:
            return spec.virtual_epoch_length or None
        return spec.limit or None

    def _one_pass(self) -> Iterator[Any]:
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
            if meta.get("arena"):
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

    def _record(self, meta: dict[str, Any]) -> None:
        wc = self.worker_config
        self._snapshots[meta["s"]] = meta["snap"]
        self._consumed = (meta["m"] - self._origin - wc.rank) // wc.world_size + 1
        self._pass_offset += 1

    def _open_source(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        wc = self.worker_config
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
            self.dataset,
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
        for snapshot in self._snapshots.values():
            for i, reader in enumerate(snapshot["stages"][0]["readers"]):
                consumed[i] += int(reader.get("yielded", 0))
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
        te = self.dataset.spec.task_encoder
        for hook in ("encode_sample", "encode_batch"):
            if te.is_active(hook) and not getattr(getattr(te, hook), "__stateless__", False):
                return False
        return True

    def restore_sample(self, restore_key: Any) -> Any:
        """Regenerate a yielded item from its ``__restore_key__`` (pure hooks only)."""
        if not self.can_restore_sample():
            raise RuntimeError("restore_sample needs @stateless encode_sample / encode_batch hooks")
        key = as_key(restore_key)
        if not (isinstance(key, tuple) and len(key) == 3 and key[0] == "Stream"):
            raise ValueError(f"not a restore key of this loader: {restore_key!r}")
        stream = build_stream(self.dataset.spec, key[1])
        value = stream.rebuild(key[2])
        from energon.pipeline.stages import attach_restore_key

        attach_restore_key(value, key)
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
