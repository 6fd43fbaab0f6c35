"""``megatron.energon.flavors``: the reference's dataset factories over energon's leaves.

A factory describes one dataset split with its reading options (training or not, shuffling over
epochs, parallel slices, subset); ``build()`` gives the dataset of its samples, one pass per loader
pass, as energon's pipeline loads it (sliced per logical stream, decoded with ``decoder``). All
factories are one class underneath: they differ only in how the sample builder is chosen
(``dataset.yaml``, a sample type with a field map or sample loader, crude dicts, JSONL, a join).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from energon import epath
from energon.av import AVData, AVDecoder
from energon.compat.deprecation import warn_deprecated
from energon.compat.epathlib import EPath
from energon.compat.jsonl.ijsonl import IJsonlIndexReader
from energon.compat.jsonl.jsonl_prepare import JsonlPreparator
from energon.compat.module_loader import ModuleLoader
from energon.compat.savable import FlexState, Savable
from energon.compat.webdataset.field_access import split_field_access
from energon.compat.webdataset.indexing import JoinIndexReader
from energon.compat.webdataset.itar_reader import JoinIndexFileITarReader
from energon.compat.webdataset.metadata import WebdatasetMeta
from energon.compat.webdataset.prepare import WebdatasetPreparator
from energon.compat.webdataset.sample_loader import RawSampleData, WebdatasetSampleLoaderDataset
from energon.compat.webdataset.sharder import Sharder
from energon.compat.webdataset.structs import DatasetSubset, FilteredSample, ShardInfo
from energon.compat.wrappers.base import add_sample_restore_key, set_sample_restore_key
from energon.compat.wrappers.map_dataset import MapDataset
from energon.decode import SampleDecoder
from energon.errors import EmptyDatasetError
from energon.format.layout import MAIN_FOLDER_NAME
from energon.loader.savable_dataset import SavableDataset
from energon.pipeline.spec import PipelineSpec
from energon.plan.sources import Source
from energon.samples import (
    Batch,
    CaptioningSample,
    CrudeSample,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    PinMemoryMixin,
    Sample,
    SimilarityInterleavedSample,
    TextSample,
    VidQASample,
    VQAOCRSample,
    VQASample,
)
from energon.samples.edataclass import edataclass
from energon.samples.source_info import SourceInfo
from energon.source.dataset_config import SampleBuilder, load_sample_builder
from energon.source.file_store import FileStore
from energon.task_encoder import base as core_task_encoder
from energon.worker import WorkerConfig

__path__: list[str] = []  # a package for the alias: flavors.* and flavors.webdataset.* map here

DEBUG_SHARD_PRINT = False  # the reference's debug switch; energon logs through WorkerConfig

T_sample = TypeVar("T_sample", covariant=True)

__all__ = [
    "AVData",
    "AVDecoder",
    "BaseCoreDatasetFactory",
    "BaseWebdatasetFactory",
    "Batch",
    "CaptioningSample",
    "CaptioningWebdataset",
    "CrudeJsonlDatasetFactory",
    "CrudeSample",
    "CrudeWebdataset",
    "DatasetSubset",
    "DefaultCrudeJsonlDatasetFactory",
    "DefaultDecoderWebdatasetFactory",
    "DefaultGenericWebdatasetFactory",
    "EPath",
    "EmptyDatasetError",
    "FileStore",
    "FilteredSample",
    "FlexState",
    "IJsonlIndexReader",
    "ImageClassificationSample",
    "ImageClassificationWebdataset",
    "ImageSample",
    "ImageWebdataset",
    "InterleavedSample",
    "InterleavedWebdataset",
    "JoinIndexFileITarReader",
    "JoinIndexReader",
    "JoinedWebdatasetFactory",
    "MapDataset",
    "ModuleLoader",
    "MultiChoiceVQASample",
    "MultiChoiceVQAWebdataset",
    "OCRSample",
    "OCRWebdataset",
    "PinMemoryMixin",
    "RawSampleData",
    "Sample",
    "SampleDecoder",
    "Savable",
    "SavableDataset",
    "ShardInfo",
    "Sharder",
    "SimilarityInterleavedSample",
    "SimilarityInterleavedWebdataset",
    "SourceInfo",
    "StandardWebdatasetFactory",
    "TextSample",
    "TextWebdataset",
    "VQAOCRSample",
    "VQAOCRWebdataset",
    "VQASample",
    "VQAWebdataset",
    "VidQASample",
    "VidQAWebdataset",
    "WebdatasetMeta",
    "WebdatasetSampleLoaderDataset",
    "add_sample_restore_key",
    "edataclass",
    "set_sample_restore_key",
    "split_field_access",
    "warn_deprecated",
]


class ExtendableDataclassMixin:
    """``Cls.extend(instance, **new_fields)``: a ``Cls`` with the fields of ``instance`` (an
    instance of a base dataclass) plus the new ones."""

    @classmethod
    def extend(cls, src: Any, **kwargs: Any) -> Any:
        fields = {f.name: getattr(src, f.name) for f in dataclasses.fields(src) if f.init}
        return cls(**{**fields, **kwargs})


class State(ExtendableDataclassMixin):
    """Base of the reference's dataclass states (energon's states are plain dicts)."""


def legacy_handler(handler: Callable[..., None]) -> Callable[..., None]:
    """An error handler taking ``(exception, key, sources)``; a two-argument handler
    ``(exception, key)`` is wrapped."""
    try:
        params = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return handler
    positional = [
        p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) == 2 and not any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return lambda exc, key, sources=None: handler(exc, key)
    return handler


_KEEP: Any = object()


class BaseCoreDatasetFactory(Generic[T_sample]):
    """One dataset split and how to read it; ``build()`` makes the dataset of its samples."""

    __sample_type__: type | None = None

    source: Source
    training: bool
    worker_config: WorkerConfig
    shuffle_over_epochs: int | None

    def _setup(
        self,
        source: Source,
        *,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: Any = _KEEP,
        parallel_shard_iters: int | None = None,
        max_samples_per_sequence: int | None = None,
        decoder: Any = None,
    ) -> None:
        if not isinstance(worker_config, WorkerConfig):
            raise TypeError("worker_config must be an energon WorkerConfig")
        self.source = source
        self.training = training
        self.worker_config = worker_config
        if shuffle_over_epochs is _KEEP:  # a resolved source already says how it shuffles
            shuffle_over_epochs = source.shuffle_over_epochs
        else:
            source.shuffle_over_epochs = shuffle_over_epochs if training else None
        self.shuffle_over_epochs = shuffle_over_epochs
        self.parallel_shard_iters = parallel_shard_iters
        self.max_samples_per_sequence = max_samples_per_sequence
        self.decoder = decoder

    @classmethod
    def from_source(cls, source: Source, **options: Any) -> BaseCoreDatasetFactory:
        """A factory for a source resolved by energon (metadataset entries)."""
        factory = cls.__new__(cls)
        factory._setup(source, **options)
        return factory

    @property
    def path(self) -> Any:
        from energon.compat.epathlib import EPath

        return EPath(self.source.leaf.root if hasattr(self.source.leaf, "root") else "")

    @property
    def paths(self) -> list[Any]:
        return [self.path]

    @property
    def subflavors(self) -> dict[str, Any]:
        """The leaf's subflavors (updating this dict changes what its samples carry)."""
        return self.source.leaf.subflavors

    @subflavors.setter
    def subflavors(self, value: dict[str, Any]) -> None:
        self.source.leaf.subflavors = dict(value or {})

    @property
    def is_crude(self) -> bool:
        return self.source.leaf.builder.kind == "crude"

    def __len__(self) -> int:
        return len(self.source)

    def build(self, worker_rotation_offset: int = 0) -> SavableDataset:
        """The dataset of this split's samples (unbatched, one pass per loader pass).

        ``worker_rotation_offset`` is accepted; energon balances remainders across sources itself
        when they are blended by a metadataset."""
        wc = self.worker_config
        spec = PipelineSpec(
            sources=[self.source],
            mode="none",
            training=self.training,
            seed=wc.seed_offset,
            num_streams=wc.default_num_streams,
            batch_size=None,
            max_samples_per_sequence=self.max_samples_per_sequence if self.training else None,
            parallel_shard_iters=self.parallel_shard_iters,
            repeat=False,
            task_encoder=core_task_encoder.TaskEncoder(),
            decoder=self.decoder,
            error_handler=wc.global_error_handler,
            even_ranks=False,
        )
        return SavableDataset.from_spec(spec, wc)

    def as_file_store(self) -> Any:
        from energon.source.file_store import WebdatasetFileStore

        return WebdatasetFileStore(self.source.leaf.root)

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "training": self.training,
            "_path": str(self.path),
            "shuffle_over_epochs": self.shuffle_over_epochs,
            "parallel_shard_iters": self.parallel_shard_iters,
            "max_samples_per_sequence": self.max_samples_per_sequence,
            **self.source.config(),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!s}, {len(self)} samples)"


def _open_webdataset_source(
    path: Any,
    *,
    split_part: str,
    builder: SampleBuilder,
    split_config: str | None,
    subset: DatasetSubset | None,
) -> Source:
    from energon.source.webdataset import WebdatasetLeaf

    root = epath.normalize(os.fspath(path))
    leaf = WebdatasetLeaf.open(
        root, split_part=split_part, split_config=split_config, builder=builder
    )
    start, end = (subset or DatasetSubset()).compute_subset(len(leaf))
    if start >= end:
        raise EmptyDatasetError(f"{root}: the subset of split {split_part!r} is empty")
    return Source(leaf=leaf, start=start, end=end)


class BaseWebdatasetFactory(BaseCoreDatasetFactory[T_sample], WebdatasetPreparator):
    """A prepared WebDataset split; subclasses say how parts become samples."""

    def __init__(
        self,
        path: Any,
        *,
        split_part: str,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: int | None = 1,
        parallel_shard_iters: int | None = None,
        max_samples_per_sequence: int | None = None,
        subset: DatasetSubset | None = None,
        split_config: str | None = None,
        part_filter: Callable[[str], bool] | None = None,
    ) -> None:
        source = _open_webdataset_source(
            path,
            split_part=split_part,
            builder=self._sample_builder(path, part_filter),
            split_config=split_config,
            subset=subset,
        )
        self.split_part = split_part
        self._setup(
            source,
            training=training,
            worker_config=worker_config,
            shuffle_over_epochs=shuffle_over_epochs,
            parallel_shard_iters=parallel_shard_iters,
            max_samples_per_sequence=max_samples_per_sequence,
            decoder=getattr(self, "_decoder", None),
        )

    def _sample_builder(self, path: Any, part_filter: Any) -> SampleBuilder:
        return load_sample_builder(epath.normalize(os.fspath(path)))

    def sample_filter(self, key: str) -> bool:
        """Whether the sample ``key`` is read (all are; exclusions come from the split config)."""
        return True

    def load_sample(self, raw_data: dict[str, Any]) -> T_sample:
        """The sample of a raw sample (``{"__key__", "__restore_key__", "__sources__", part:
        bytes, ...}``): its parts decoded (``decoder``) and built as this dataset builds them."""
        builder = self.source.leaf.builder
        parts = {
            name: self.decoder.decode_part(name, data) if self.decoder is not None else data
            for name, data in raw_data.items()
            if not name.startswith("__") and builder.wants_part(name)
        }
        base = {
            "__key__": raw_data["__key__"],
            "__restore_key__": tuple(raw_data.get("__restore_key__", ())),
            "__subflavors__": dict(builder.subflavors),
            "__sources__": tuple(raw_data.get("__sources__", ())),
        }
        return builder.build(parts, base, raw_data.get("__shard__", ""))


def _part_filter(part_filter: str | list[str] | Callable[[str], bool] | None) -> Any:
    if part_filter is None or callable(part_filter):
        return part_filter
    allowed = {part_filter} if isinstance(part_filter, str) else set(part_filter)
    return lambda part: part in allowed


class DefaultGenericWebdatasetFactory(BaseWebdatasetFactory[T_sample]):
    """Samples of ``__sample_type__`` from a ``field_map`` or a ``sample_loader``."""

    def __init__(
        self,
        path: Any,
        *,
        subflavors: dict[str, Any] | None = None,
        field_map: dict[str, str] | None = None,
        sample_loader: str | Callable[[dict], dict] | None = None,
        part_filter: str | list[str] | Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        self._field_map = field_map
        self._sample_loader = sample_loader
        self._subflavors = dict(subflavors or {})
        super().__init__(path, part_filter=part_filter, **kwargs)

    def load_sample(self, sample: dict[str, Any]) -> T_sample:
        """The sample of a raw sample (see :meth:`BaseWebdatasetFactory.load_sample`)."""
        return super().load_sample(sample)

    def _sample_builder(self, path: Any, part_filter: Any) -> SampleBuilder:
        sample_type = self.__sample_type__
        if self._field_map is None and self._sample_loader is None:
            builder = load_sample_builder(epath.normalize(os.fspath(path)))
            builder.subflavors = {**builder.subflavors, **self._subflavors}
            return builder
        if self._sample_loader is not None:
            loader = self._sample_loader
            if isinstance(loader, str):
                from energon.source.sample_loader import load_sample_loader

                loader = load_sample_loader(epath.join(os.fspath(path), MAIN_FOLDER_NAME), loader)
            return SampleBuilder(
                "sample_loader",
                sample_type=sample_type,
                sample_loader=loader,
                part_filter=_part_filter(part_filter),
                subflavors=self._subflavors,
            )
        from energon.source.fieldmap import resolve_field_map

        return SampleBuilder(
            "field_map",
            sample_type=sample_type,
            field_map=resolve_field_map(self._field_map, sample_type),
            subflavors=self._subflavors,
        )


class DefaultDecoderWebdatasetFactory(DefaultGenericWebdatasetFactory[T_sample]):
    """Parts are decoded (``decoder``, by file extension) before samples are built."""

    def __init__(self, path: Any, *, decoder: Any = SampleDecoder(), **kwargs: Any) -> None:  # noqa: B008 - the reference's default
        self._decoder = decoder
        super().__init__(path, **kwargs)


class StandardWebdatasetFactory(DefaultDecoderWebdatasetFactory[T_sample]):
    """Samples of the given ``sample_type``."""

    def __init__(self, path: Any, *, sample_type: type, **kwargs: Any) -> None:
        self.__sample_type__ = sample_type
        super().__init__(path, **kwargs)


class CrudeWebdataset(DefaultDecoderWebdatasetFactory[CrudeSample]):
    """Crude samples: dicts of all (decoded) parts, cooked later by the task encoder's cookers."""

    __sample_type__ = CrudeSample

    def __init__(
        self,
        path: Any,
        *,
        subflavors: dict[str, Any] | None = None,
        part_filter: str | list[str] | Callable[[str], bool] = lambda _: True,
        **kwargs: Any,
    ) -> None:
        if "sample_loader" in kwargs or "field_map" in kwargs:
            raise TypeError("CrudeWebdataset takes neither sample_loader nor field_map")
        self._crude_filter = _part_filter(part_filter)
        self._crude_subflavors = dict(subflavors or {})
        self._decoder = kwargs.pop("decoder", None) or SampleDecoder()
        BaseWebdatasetFactory.__init__(self, path, **kwargs)

    def _sample_builder(self, path: Any, part_filter: Any) -> SampleBuilder:
        return SampleBuilder(
            "crude", part_filter=self._crude_filter, subflavors=self._crude_subflavors
        )


def _flavor(name: str, sample_type: type) -> type:
    doc = f"Deprecated flavor: ``StandardWebdatasetFactory`` of ``{sample_type.__name__}``."

    def __init__(self: Any, path: Any, **kwargs: Any) -> None:
        DefaultDecoderWebdatasetFactory.__init__(self, path, **kwargs)

    return type(
        name,
        (DefaultDecoderWebdatasetFactory,),
        {
            "__sample_type__": sample_type,
            "__doc__": doc,
            "__module__": __name__,
            "__init__": __init__,
        },
    )


CaptioningWebdataset = _flavor("CaptioningWebdataset", CaptioningSample)
ImageWebdataset = _flavor("ImageWebdataset", ImageSample)
ImageClassificationWebdataset = _flavor("ImageClassificationWebdataset", ImageClassificationSample)
InterleavedWebdataset = _flavor("InterleavedWebdataset", InterleavedSample)
MultiChoiceVQAWebdataset = _flavor("MultiChoiceVQAWebdataset", MultiChoiceVQASample)
OCRWebdataset = _flavor("OCRWebdataset", OCRSample)
SimilarityInterleavedWebdataset = _flavor(
    "SimilarityInterleavedWebdataset", SimilarityInterleavedSample
)
TextWebdataset = _flavor("TextWebdataset", TextSample)
VidQAWebdataset = _flavor("VidQAWebdataset", VidQASample)
VQAOCRWebdataset = _flavor("VQAOCRWebdataset", VQAOCRSample)
VQAWebdataset = _flavor("VQAWebdataset", VQASample)


class CrudeJsonlDatasetFactory(BaseCoreDatasetFactory[CrudeSample], JsonlPreparator):
    """A JSONL file as crude samples (one dict per line)."""

    __sample_type__ = CrudeSample

    def __init__(
        self,
        path: Any,
        *,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: int | None = 1,
        parallel_shard_iters: int | None = None,
        max_samples_per_sequence: int | None = None,
        subset: DatasetSubset | None = None,
        part_filter: Callable[[str], bool] | None = None,
    ) -> None:
        from energon.source.jsonl import JsonlLeaf

        subflavors = getattr(self, "_jsonl_subflavors", None)
        leaf = JsonlLeaf.open(epath.normalize(os.fspath(path)), subflavors=subflavors)
        start, end = (subset or DatasetSubset()).compute_subset(len(leaf))
        self._setup(
            Source(leaf=leaf, start=start, end=end),
            training=training,
            worker_config=worker_config,
            shuffle_over_epochs=shuffle_over_epochs,
            parallel_shard_iters=parallel_shard_iters,
            max_samples_per_sequence=max_samples_per_sequence,
        )

    @property
    def is_crude(self) -> bool:
        return True

    def as_file_store(self) -> Any:
        raise NotImplementedError("a JSONL dataset has no file store of its own")


class DefaultCrudeJsonlDatasetFactory(CrudeJsonlDatasetFactory):
    """``CrudeJsonlDatasetFactory`` with subflavors (a ``decoder`` argument is ignored)."""

    def __init__(
        self, path: Any, *, subflavors: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        kwargs.pop("decoder", None)
        self._jsonl_subflavors = subflavors
        super().__init__(path, **kwargs)


class JoinedWebdatasetFactory(BaseCoreDatasetFactory[T_sample]):
    """Joined datasets. energon builds joins from a metadataset ``join:`` (prepared with
    ``energon prepare`` on the metadataset); that is how instances of this class come about."""

    def __init__(
        self,
        inner_datasets: Any,
        *,
        training: bool,
        worker_config: WorkerConfig,
        shuffle_over_epochs: int | None = 1,
        parallel_shard_iters: int | None = None,
        max_samples_per_sequence: int | None = None,
        subset: DatasetSubset | None = None,
        join_index: Any,
        joiner: Any,
    ) -> None:
        raise NotImplementedError(
            "JoinedWebdatasetFactory(...) cannot be constructed directly in energon: describe the "
            "join in a metadataset (join: / joiner:) and load it with get_train_dataset or "
            "load_dataset (see docs/migrating.md)"
        )

    def load_sample(self, samples: Any) -> T_sample:
        """Joined samples are built by the join's joiner (see the class docstring)."""
        raise NotImplementedError(
            "JoinedWebdatasetFactory: joined samples come from a metadataset join: (joiner:)"
        )

    @property
    def is_crude(self) -> bool:
        return False

    def as_file_store(self) -> Any:
        raise NotImplementedError("a joined dataset has no single file store")


def factory_for_source(source: Source, **options: Any) -> BaseCoreDatasetFactory:
    """The factory class the reference would use for an energon source, wrapping it."""
    leaf = source.leaf
    kind = leaf.builder.kind
    leaf_type = type(leaf).__name__
    if leaf_type == "JsonlLeaf":
        options.pop("decoder", None)
        return DefaultCrudeJsonlDatasetFactory.from_source(source, **options)
    if leaf_type == "JoinLeaf":
        return JoinedWebdatasetFactory.from_source(source, **options)
    if kind == "crude":
        return CrudeWebdataset.from_source(source, **options)
    factory = StandardWebdatasetFactory.from_source(source, **options)
    factory.__sample_type__ = leaf.builder.sample_type
    return factory
