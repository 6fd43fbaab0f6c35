"""``megatron.energon.task_encoder``: energon's task encoders, and the composition behind their
``build_*`` hooks.

The reference builds every pipeline through overridable task-encoder methods
(``build_train_datasets``, ``build_val_datasets``, ``build_batch``, ``build_encode_sample``,
``build_cook_crude_sample``, ``_load_dataset``). energon's ``TaskEncoder`` declares them
(``energon.task_encoder.composition``); their default bodies are :class:`ReferenceComposition`,
which composes the wrappers of ``energon.compat.wrappers`` and is registered with the core when this
module is imported (``from energon import TaskEncoder`` imports it). A task encoder that overrides
none of the hooks keeps energon's own pipeline (exact blends, even validation ranks, ...); one that
overrides any of them gets the composition its methods describe.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from energon.compat.cache import CachePool, aux_file_stores
from energon.compat.deprecation import warn_deprecated
from energon.compat.epathlib import EPath
from energon.compat.flavors import BaseCoreDatasetFactory, CrudeWebdataset, ExtendableDataclassMixin
from energon.compat.metadataset import (
    DatasetBlendMode,
    LoadedDataset,
    load_dataset,
    loaded_datasets_for,
)
from energon.compat.rng import SystemRng
from energon.compat.wrappers import (
    BatchDataset,
    BlendDataset,
    ConcatDataset,
    EpochizeDataset,
    GroupBatchDataset,
    LimitDataset,
    MapDataset,
    PackingDataset,
    RepeatDataset,
    ShuffleBufferDataset,
)
from energon.compat.wrappers.log_sample_dataset import LogSampleDataset
from energon.decode.sample_decoder import SampleDecoder
from energon.loader import build as core_build
from energon.loader.build import get_train_dataset, get_val_dataset
from energon.loader.savable_dataset import SavableDataset
from energon.samples import Batch
from energon.samples.base import CrudeSample, PinMemoryMixin, Sample
from energon.samples.collate import batch_list, batch_pad_stack, batch_stack, generic_batch
from energon.samples.edataclass import edataclass
from energon.samples.source_info import SourceInfo
from energon.source.file_store import DecodeFileStore, FileStore, PrimaryFileStore
from energon.task_encoder.base import AugmentTaskEncoder, DefaultTaskEncoder, TaskEncoder, stateless
from energon.task_encoder.composition import register_composition
from energon.task_encoder.cooking import Cooker, basic_sample_keys, cooker, select_cooker
from energon.worker import WorkerConfig

__path__: list[str] = []  # a package for the alias: task_encoder.base/.cooking/.loader map here

__all__ = [
    "get_cooker_need_cache",
    "get_cooker_need_primary",
    "AugmentTaskEncoder",
    "BaseCoreDatasetFactory",
    "Batch",
    "CachePool",
    "Cooker",
    "CrudeSample",
    "CrudeWebdataset",
    "DefaultTaskEncoder",
    "EPath",
    "ExtendableDataclassMixin",
    "FileStore",
    "LoadedDataset",
    "LogSampleDataset",
    "PinMemoryMixin",
    "Sample",
    "SampleDecoder",
    "SavableDataset",
    "SourceInfo",
    "SystemRng",
    "TaskEncoder",
    "WorkerConfig",
    "basic_sample_keys",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "cooker",
    "edataclass",
    "generic_batch",
    "get_failure_tolerance",
    "get_stateless",
    "get_train_dataset",
    "get_val_dataset",
    "get_val_datasets",
    "load_dataset",
    "stateless",
    "warn_deprecated",
]


@functools.wraps(core_build.get_val_datasets)
def get_val_datasets(path: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
    """One validation dataset per leaf, each with the reference's factory describing the leaf."""
    from energon.compat.flavors import factory_for_source

    return [
        (
            dataset,
            factory_for_source(
                source,
                training=False,
                worker_config=dataset.worker_config,
                decoder=dataset.spec.decoder,
            ),
        )
        for dataset, source in core_build.get_val_datasets(path, **kwargs)
    ]


def get_cooker_need_cache(fn: Callable) -> bool:
    """Whether a cook function was marked ``@cooker(need_cache=True)``."""
    return bool(getattr(fn, "__need_cache__", False))


def get_cooker_need_primary(fn: Callable) -> bool:
    """Whether a cook function was marked ``@cooker(need_primary=True)``."""
    return bool(getattr(fn, "__need_primary__", False))


def get_stateless(fn: Callable) -> bool:
    """Whether ``fn`` was marked ``@stateless``."""
    return bool(getattr(fn, "__stateless__", False))


def get_failure_tolerance(fn: Callable, default_failure_tolerance: int | None = None) -> int:
    """The tolerance ``@stateless(failure_tolerance=...)`` set on ``fn``, else the default
    (0 when none is given, as the reference answers)."""
    default = default_failure_tolerance or 0
    return int(getattr(fn, "__failure_tolerance__", default))


class ReferenceComposition:
    """The reference's default ``build_*`` bodies; ``te`` is the task encoder they belong to."""

    def compose(self, te: TaskEncoder, spec: Any, worker_config: Any) -> Any:
        """Called by ``get_train_dataset`` / ``get_val_dataset`` for a task encoder that
        overrides a ``build_*`` hook: the dataset its hooks compose."""

        loaded = loaded_datasets_for(spec, worker_config)
        if spec.training:
            return te.build_train_datasets(
                datasets=loaded.datasets,
                worker_config=worker_config,
                batch_size=spec.batch_size,
                batch_drop_last=spec.batch_drop_last,
                packing_buffer_size=spec.packing_buffer_size,
                virtual_epoch_length=spec.virtual_epoch_length,
                shuffle_buffer_size=spec.shuffle_buffer_size,
                blend_mode=loaded.blend_mode,
                repeat=spec.repeat,
            )
        return te.build_val_datasets(
            datasets=loaded.datasets,
            worker_config=worker_config,
            batch_size=spec.batch_size,
            batch_drop_last=spec.batch_drop_last,
            packing_buffer_size=spec.packing_buffer_size,
            limit=spec.limit,
        )

    def load_dataset(
        self, te: TaskEncoder, dataset: Any, worker_rotation_offset: int, worker_config: Any
    ) -> Any:
        """A loaded dataset's samples: the factory's dataset, cooked if it is crude."""
        built = dataset.dataset.build(worker_rotation_offset=worker_rotation_offset)
        if getattr(dataset.dataset, "is_crude", False):
            built = te.build_cook_crude_sample(
                built,
                worker_config=worker_config,
                subflavors=dataset.dataset.subflavors,
                get_primary_aux=dataset.dataset.as_file_store,
                aux=aux_file_stores(dataset.aux),
            )
        return built

    def build_cook_crude_sample(
        self,
        te: TaskEncoder,
        dataset: Any,
        *,
        worker_config: Any,
        subflavors: dict[str, Any],
        get_primary_aux: Callable[[], Any],
        aux: dict[str, Any] | None = None,
    ) -> Any:

        selected = select_cooker(te, subflavors)
        if selected is None:
            raise AssertionError("a crude dataset needs cookers on the task encoder")
        decoder = te.decoder
        stores = {
            name: DecodeFileStore(store, decoder=decoder) if decoder is not None else store
            for name, store in (aux or {}).items()
        }
        primary = None
        if selected.need_primary:
            # outside any error policy: a primary store that cannot be opened stops the run
            primary = get_primary_aux()
            if decoder is not None:
                primary = DecodeFileStore(primary, decoder=decoder)

        @stateless
        def cook(sample: Any) -> Any:
            extra = dict(stores)
            if primary is not None:
                extra["primary"] = PrimaryFileStore(primary, sample["__key__"])
            if selected.need_cache:
                extra["cache"] = te.cache
            return te.cook_crude_sample(sample, selected, extra)

        return MapDataset(dataset, cook, stateless_map_fn=True, worker_config=worker_config)

    def build_encode_sample(self, te: TaskEncoder, dataset: Any, *, worker_config: Any) -> Any:

        for hook in ("preencode_sample", "encode_sample"):
            if te.is_active(hook):
                fn = getattr(te, hook)
                return MapDataset(
                    dataset,
                    fn,
                    stateless_map_fn=get_stateless(fn),
                    failure_tolerance=get_failure_tolerance(fn, te.__default_failure_tolerance__),
                    worker_config=worker_config,
                )
        return dataset

    def build_batch(
        self,
        te: TaskEncoder,
        dataset: Any,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: Any,
    ) -> Any:

        tolerance = te.__default_failure_tolerance__
        post = te.postencode_sample if te.is_active("postencode_sample") else None
        if packing_buffer_size is not None:
            dataset = PackingDataset(
                dataset,
                buffer_size=packing_buffer_size,
                pre_packer=te.select_samples_to_pack,
                final_packer=te.pack_selected_samples,
                final_packer_stateless=get_stateless(te.pack_selected_samples),
                sample_encoder=post,
                sample_encoder_stateless=post is not None and get_stateless(post),
                pre_packer_failure_tolerance=get_failure_tolerance(
                    te.select_samples_to_pack, tolerance
                ),
                final_packer_failure_tolerance=get_failure_tolerance(
                    te.pack_selected_samples, tolerance
                ),
                worker_config=worker_config,
            )
        elif post is not None:
            dataset = MapDataset(
                dataset, post, stateless_map_fn=get_stateless(post), worker_config=worker_config
            )
        if te.is_active("batch_group_criterion"):
            dataset = GroupBatchDataset(
                dataset,
                fixed_batch_size=batch_size,
                sample_group_key=te.batch_group_criterion,
                batcher=te.batch,
                drop_last=batch_drop_last,
                failure_tolerance=get_failure_tolerance(te.batch, tolerance),
                worker_config=worker_config,
            )
        elif batch_size is not None:
            dataset = BatchDataset(
                dataset,
                batch_size=batch_size,
                batcher=te.batch,
                batcher_stateless=get_stateless(te.batch),
                drop_last=batch_drop_last,
                failure_tolerance=get_failure_tolerance(te.batch, tolerance),
                worker_config=worker_config,
            )
        else:
            return dataset
        if te.is_active("encode_batch"):
            dataset = MapDataset(
                dataset,
                te.encode_batch,
                stateless_map_fn=get_stateless(te.encode_batch),
                failure_tolerance=get_failure_tolerance(te.encode_batch, tolerance),
                worker_config=worker_config,
            )
        return dataset

    def build_train_datasets(
        self,
        te: TaskEncoder,
        *,
        datasets: list[Any],
        worker_config: Any,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        virtual_epoch_length: int = 0,
        shuffle_buffer_size: int | None = None,
        blend_mode: Any = None,
        repeat: bool = True,
    ) -> Any:

        blend_mode = blend_mode or DatasetBlendMode.NONE
        loaded = [
            te._load_dataset(d, offset, worker_config)
            for d, offset in zip(datasets, _rotation_offsets(datasets, worker_config))
        ]
        if blend_mode == DatasetBlendMode.SAMPLE_REPETITIONS:
            parts = []
            for d, ds in zip(datasets, loaded):
                reps = d.repetitions if d.repetitions is not None else 1
                if reps != 1:
                    ds = RepeatDataset(ds, repeats=reps, worker_config=worker_config)
                parts.append((ds, len(d.dataset) * reps))
            dataset = (
                BlendDataset(*parts, worker_config=worker_config) if len(parts) > 1 else parts[0][0]
            )
            if repeat:
                dataset = RepeatDataset(dataset, worker_config=worker_config)
        else:
            if not repeat and len(loaded) > 1:
                raise ValueError(
                    "a weighted blend is infinite: use repeat=True (or blend_epochized)"
                )
            wrapped = [
                RepeatDataset(ds, worker_config=worker_config) if repeat else ds for ds in loaded
            ]
            if len(wrapped) == 1:
                dataset = wrapped[0]
            else:
                weights = [d.weight if d.weight is not None else 1.0 for d in datasets]
                dataset = BlendDataset(*zip(wrapped, weights), worker_config=worker_config)
        if shuffle_buffer_size is not None and shuffle_buffer_size > 1:
            dataset = ShuffleBufferDataset(
                dataset, size=shuffle_buffer_size, worker_config=worker_config
            )
        dataset = te.build_encode_sample(dataset, worker_config=worker_config)
        dataset = te.build_batch(
            dataset,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            worker_config=worker_config,
        )
        if virtual_epoch_length > 0:
            dataset = EpochizeDataset(
                dataset, length=virtual_epoch_length, worker_config=worker_config
            )
        return dataset

    def build_val_datasets(
        self,
        te: TaskEncoder,
        *,
        datasets: list[Any],
        worker_config: Any,
        batch_size: int,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        limit: int | None = None,
    ) -> Any:

        loaded = [
            te._load_dataset(d, offset, worker_config)
            for d, offset in zip(datasets, _rotation_offsets(datasets, worker_config))
        ]
        dataset = (
            loaded[0] if len(loaded) == 1 else ConcatDataset(*loaded, worker_config=worker_config)
        )
        dataset = te.build_encode_sample(dataset, worker_config=worker_config)
        dataset = te.build_batch(
            dataset,
            batch_size=batch_size,
            batch_drop_last=batch_drop_last,
            packing_buffer_size=packing_buffer_size,
            worker_config=worker_config,
        )
        if limit is not None and limit > 0:
            dataset = LimitDataset(
                dataset, length=limit, reset_after_epoch=True, worker_config=worker_config
            )
        return dataset


def _rotation_offsets(datasets: list[Any], worker_config: Any) -> list[int]:
    """Each dataset's remainder samples start on the worker after the previous one's."""
    global_workers = max(1, worker_config.num_workers) * worker_config.world_size
    offsets, total = [], 0
    for d in datasets:
        offsets.append(total % global_workers)
        total += len(d.dataset)
    return offsets


register_composition(ReferenceComposition())
