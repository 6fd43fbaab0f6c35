"""``megatron.energon.task_encoder``: energon's task encoders plus the reference's pipeline hooks.

The reference builds every pipeline through overridable methods of the task encoder
(``build_train_datasets``, ``build_val_datasets``, ``build_batch``, ``build_encode_sample``,
``build_cook_crude_sample``, ``_load_dataset``). Here they compose the wrappers of
``energon.compat.wrappers``. A task encoder that overrides none of them keeps energon's own pipeline
(exact blends, even validation ranks, ...); one that overrides any of them gets the composition its
methods describe (``compose_dataset`` is the hook ``get_train_dataset`` asks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from energon.loader import build as core_build
from energon.loader.build import get_train_dataset, get_val_dataset
from energon.samples import Batch
from energon.samples.collate import batch_list, batch_pad_stack, batch_stack, generic_batch
from energon.task_encoder import base as core
from energon.task_encoder.base import hook_context, stateless
from energon.task_encoder.cooking import Cooker, basic_sample_keys, cooker, select_cooker

__path__: list[str] = []  # a package for the alias: task_encoder.base/.cooking/.loader map here

__all__ = [
    "AugmentTaskEncoder",
    "Batch",
    "Cooker",
    "DefaultTaskEncoder",
    "TaskEncoder",
    "basic_sample_keys",
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "cooker",
    "generic_batch",
    "get_failure_tolerance",
    "get_stateless",
    "get_train_dataset",
    "get_val_dataset",
    "get_val_datasets",
    "stateless",
]

_BUILDERS = (
    "build_train_datasets",
    "build_val_datasets",
    "build_batch",
    "build_encode_sample",
    "build_cook_crude_sample",
    "_load_dataset",
)


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


def get_stateless(fn: Callable) -> bool:
    """Whether ``fn`` was marked ``@stateless``."""
    return bool(getattr(fn, "__stateless__", False))


def get_failure_tolerance(fn: Callable, default: int = 100) -> int:
    return int(getattr(fn, "__failure_tolerance__", default))


class PipelineHooks:
    """The reference's ``build_*`` methods (mixed into the task encoder classes below)."""

    @property
    def cache(self) -> Any:
        """The loader's cache pool (``get_loader(..., cache_pool=...)``), inside loader hooks."""
        if hook_context.cache_pool is None:
            raise RuntimeError(
                "no cache pool: pass cache_pool=... to get_loader / get_savable_loader"
            )
        return hook_context.cache_pool

    # -- when energon's own pipeline is replaced ---------------------------------------------
    def _composes_itself(self) -> bool:
        return any(getattr(type(self), n) is not getattr(PipelineHooks, n) for n in _BUILDERS)

    def compose_dataset(self, spec: Any, worker_config: Any) -> Any:
        """Called by ``get_train_dataset`` / ``get_val_dataset``: the composed dataset, or None to
        keep energon's pipeline (when no ``build_*`` method is overridden)."""
        if not self._composes_itself():
            return None
        from energon.compat.metadataset import loaded_datasets_for

        loaded = loaded_datasets_for(spec, worker_config)
        if spec.training:
            return self.build_train_datasets(
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
        return self.build_val_datasets(
            datasets=loaded.datasets,
            worker_config=worker_config,
            batch_size=spec.batch_size,
            batch_drop_last=spec.batch_drop_last,
            packing_buffer_size=spec.packing_buffer_size,
            limit=spec.limit,
        )

    # -- the reference's default composition -------------------------------------------------
    def _load_dataset(self, dataset: Any, worker_rotation_offset: int, worker_config: Any) -> Any:
        """A loaded dataset's samples: the factory's dataset, cooked if it is crude."""
        built = dataset.dataset.build(worker_rotation_offset=worker_rotation_offset)
        if getattr(dataset.dataset, "is_crude", False):
            from energon.compat.cache import aux_file_stores

            built = self.build_cook_crude_sample(
                built,
                worker_config=worker_config,
                subflavors=dataset.dataset.subflavors,
                get_primary_aux=dataset.dataset.as_file_store,
                aux=aux_file_stores(dataset.aux),
            )
        return built

    def build_cook_crude_sample(
        self,
        dataset: Any,
        *,
        worker_config: Any,
        subflavors: dict[str, Any],
        get_primary_aux: Callable[[], Any],
        aux: dict[str, Any] | None = None,
    ) -> Any:
        from energon.compat.wrappers import MapDataset
        from energon.source.file_store import DecodeFileStore, PrimaryFileStore

        selected = select_cooker(self, subflavors)
        if selected is None:
            raise AssertionError("a crude dataset needs cookers on the task encoder")
        decoder = self.decoder
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
                extra["cache"] = self.cache
            return self.cook_crude_sample(sample, selected, extra)

        return MapDataset(dataset, cook, stateless_map_fn=True, worker_config=worker_config)

    def build_encode_sample(self, dataset: Any, *, worker_config: Any) -> Any:
        from energon.compat.wrappers import MapDataset

        for hook in ("preencode_sample", "encode_sample"):
            if self.is_active(hook):
                fn = getattr(self, hook)
                return MapDataset(
                    dataset,
                    fn,
                    stateless_map_fn=get_stateless(fn),
                    failure_tolerance=get_failure_tolerance(fn, self.__default_failure_tolerance__),
                    worker_config=worker_config,
                )
        return dataset

    def build_batch(
        self,
        dataset: Any,
        *,
        batch_size: int | None,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        worker_config: Any,
    ) -> Any:
        from energon.compat.wrappers import (
            BatchDataset,
            GroupBatchDataset,
            MapDataset,
            PackingDataset,
        )

        tolerance = self.__default_failure_tolerance__
        post = self.postencode_sample if self.is_active("postencode_sample") else None
        if packing_buffer_size is not None:
            dataset = PackingDataset(
                dataset,
                buffer_size=packing_buffer_size,
                pre_packer=self.select_samples_to_pack,
                final_packer=self.pack_selected_samples,
                final_packer_stateless=get_stateless(self.pack_selected_samples),
                sample_encoder=post,
                sample_encoder_stateless=post is not None and get_stateless(post),
                pre_packer_failure_tolerance=get_failure_tolerance(
                    self.select_samples_to_pack, tolerance
                ),
                final_packer_failure_tolerance=get_failure_tolerance(
                    self.pack_selected_samples, tolerance
                ),
                worker_config=worker_config,
            )
        elif post is not None:
            dataset = MapDataset(
                dataset, post, stateless_map_fn=get_stateless(post), worker_config=worker_config
            )
        if self.is_active("batch_group_criterion"):
            dataset = GroupBatchDataset(
                dataset,
                fixed_batch_size=batch_size,
                sample_group_key=self.batch_group_criterion,
                batcher=self.batch,
                drop_last=batch_drop_last,
                failure_tolerance=get_failure_tolerance(self.batch, tolerance),
                worker_config=worker_config,
            )
        elif batch_size is not None:
            dataset = BatchDataset(
                dataset,
                batch_size=batch_size,
                batcher=self.batch,
                batcher_stateless=get_stateless(self.batch),
                drop_last=batch_drop_last,
                failure_tolerance=get_failure_tolerance(self.batch, tolerance),
                worker_config=worker_config,
            )
        else:
            return dataset
        if self.is_active("encode_batch"):
            dataset = MapDataset(
                dataset,
                self.encode_batch,
                stateless_map_fn=get_stateless(self.encode_batch),
                failure_tolerance=get_failure_tolerance(self.encode_batch, tolerance),
                worker_config=worker_config,
            )
        return dataset

    def build_train_datasets(
        self,
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
        from energon.compat.metadataset import DatasetBlendMode
        from energon.compat.wrappers import (
            BlendDataset,
            EpochizeDataset,
            RepeatDataset,
            ShuffleBufferDataset,
        )

        blend_mode = blend_mode or DatasetBlendMode.NONE
        loaded = [
            self._load_dataset(d, offset, worker_config)
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
        dataset = self.build_encode_sample(dataset, worker_config=worker_config)
        dataset = self.build_batch(
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
        *,
        datasets: list[Any],
        worker_config: Any,
        batch_size: int,
        batch_drop_last: bool = False,
        packing_buffer_size: int | None = None,
        limit: int | None = None,
    ) -> Any:
        from energon.compat.wrappers import ConcatDataset, LimitDataset

        loaded = [
            self._load_dataset(d, offset, worker_config)
            for d, offset in zip(datasets, _rotation_offsets(datasets, worker_config))
        ]
        dataset = (
            loaded[0] if len(loaded) == 1 else ConcatDataset(*loaded, worker_config=worker_config)
        )
        dataset = self.build_encode_sample(dataset, worker_config=worker_config)
        dataset = self.build_batch(
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


_Ts = (core.T_sample, core.T_encoded_sample, core.T_raw_batch, core.T_batch)


class TaskEncoder(PipelineHooks, core.TaskEncoder[_Ts]):  # type: ignore[misc]
    __doc__ = core.TaskEncoder.__doc__


class DefaultTaskEncoder(PipelineHooks, core.DefaultTaskEncoder[_Ts]):  # type: ignore[misc]
    __doc__ = core.DefaultTaskEncoder.__doc__


class AugmentTaskEncoder(PipelineHooks, core.AugmentTaskEncoder[_Ts]):  # type: ignore[misc]
    __doc__ = core.AugmentTaskEncoder.__doc__
