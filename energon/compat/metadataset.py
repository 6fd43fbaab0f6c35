"""``megatron.energon.metadataset``: ``load_dataset`` and the reference's loader objects.

``load_dataset(path)`` returns a loader (``DatasetLoader`` for a dataset, ``Metadataset`` /
``MetadatasetV2`` for a YAML); ``get_datasets(...)`` resolves it with energon's metadataset resolver
(inheritance of split parts, subflavors, weights, repetitions and subsets as in the reference) and
hands each leaf back as a factory with its weight or repetitions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import yaml

from energon import epath
from energon.compat.dataset_config import get_dataset_from_config, load_config
from energon.compat.epathlib import EPath
from energon.compat.flavors import BaseCoreDatasetFactory
from energon.compat.typed_converter import JsonParser
from energon.compat.webdataset.metadata import (
    EnergonDatasetType,
    check_dataset_info_present,
    get_dataset_type,
)
from energon.compat.webdataset.structs import DatasetSubset
from energon.metadataset.resolve import TraversedDatasetReference, resolve_dataset
from energon.metadataset.resolve import traverse_metadataset as core_traverse
from energon.prepare.join_indices import prepare_metadataset
from energon.samples.edataclass import edataclass
from energon.source.file_store import FileStore
from energon.task_encoder.composition import DatasetBlendMode
from energon.worker import WorkerConfig

__path__: list[str] = []  # a package for the alias: metadataset.* map here

__all__ = [
    "AuxDatasetReference",
    "AuxFilesystemReference",
    "BaseCoreDatasetFactory",
    "DatasetBlendMode",
    "DatasetLoader",
    "DatasetLoaderInterface",
    "DatasetSubset",
    "EPath",
    "EnergonDatasetType",
    "FileStore",
    "JsonParser",
    "LoadedDataset",
    "LoadedDatasetList",
    "Metadataset",
    "MetadatasetV2",
    "TraversedDatasetReference",
    "check_dataset_info_present",
    "edataclass",
    "get_dataset_from_config",
    "get_dataset_type",
    "load_config",
    "load_dataset",
    "prepare_metadataset",
    "traverse_metadataset",
]


_MODES = {
    "none": DatasetBlendMode.NONE,
    "concat": DatasetBlendMode.NONE,
    "weight": DatasetBlendMode.DATASET_WEIGHT,
    "repetitions": DatasetBlendMode.SAMPLE_REPETITIONS,
}


@dataclasses.dataclass(kw_only=True)
class LoadedDataset:
    dataset: Any
    weight: float | int | None = None
    repetitions: float | int | None = None
    aux: dict[str, Any] | None = None


@dataclasses.dataclass(kw_only=True)
class LoadedDatasetList:
    datasets: list[LoadedDataset]
    blend_mode: DatasetBlendMode = DatasetBlendMode.NONE


def _loaded(resolved: Any, **factory_options: Any) -> LoadedDatasetList:
    from energon.compat.flavors import factory_for_source
    from energon.source.file_store import open_file_store

    mode = _MODES[resolved.mode]
    datasets = []
    for source in resolved.sources:
        datasets.append(
            LoadedDataset(
                dataset=factory_for_source(source, **factory_options),
                weight=source.weight if mode == DatasetBlendMode.DATASET_WEIGHT else None,
                repetitions=source.repetitions
                if mode == DatasetBlendMode.SAMPLE_REPETITIONS
                else None,
                aux={name: open_file_store(ref) for name, ref in source.aux.items()} or None,
            )
        )
    return LoadedDatasetList(datasets=datasets, blend_mode=mode)


def loaded_datasets_for(spec: Any, worker_config: WorkerConfig) -> LoadedDatasetList:
    """The sources of a pipeline spec as the reference's loaded datasets (for ``build_*`` hooks)."""

    class _Resolved:
        sources = spec.sources
        mode = spec.mode

    return _loaded(
        _Resolved,
        training=spec.training,
        worker_config=worker_config,
        parallel_shard_iters=spec.parallel_shard_iters,
        max_samples_per_sequence=spec.max_samples_per_sequence,
        decoder=spec.decoder,
    )


class DatasetLoaderInterface:
    """A dataset (or metadataset) that can be resolved into loaded datasets."""

    path: Any

    def post_initialize(self, mds_path: Any = None) -> None:
        """Nothing to check eagerly: energon validates paths when resolving."""

    def _resolve_path(self) -> Any:
        return self.path

    def get_datasets(
        self,
        *,
        training: bool,
        split_part: str,
        worker_config: WorkerConfig,
        subflavors: dict[str, Any] | None = None,
        shuffle_over_epochs_multiplier: int | None = 1,
        subset: Any = None,
        **kwargs: Any,
    ) -> LoadedDatasetList:
        resolved = resolve_dataset(
            self._resolve_path(),
            split_part=getattr(self, "split_part", None) or split_part,
            training=training,
            subflavors={**(getattr(self, "subflavors", None) or {}), **(subflavors or {})},
            shuffle_over_epochs_multiplier=shuffle_over_epochs_multiplier if training else None,
            dataset_config=getattr(self, "dataset_config", None),
            split_config=getattr(self, "split_config", None),
        )
        if subset is not None:
            for source in resolved.sources:
                start, end = subset.compute_subset(len(source))
                source.start, source.end = source.start + start, source.start + end
        return _loaded(
            resolved,
            training=training,
            worker_config=worker_config,
            parallel_shard_iters=kwargs.pop("parallel_shard_iters", None),
            max_samples_per_sequence=kwargs.pop("max_samples_per_sequence", None),
            decoder=kwargs.pop("decoder", None),
        )

    def prepare(self, split_part: str | None = None) -> Sequence[Any]:
        return []

    def traverse(
        self, mds_path: Any = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        return traverse_metadataset(self.path, split_part=split_part)


class DatasetLoader(DatasetLoaderInterface):
    """A single dataset (prepared WebDataset directory or JSONL file)."""

    def __init__(
        self,
        *,
        path: Any,
        split_part: str | None = None,
        subflavors: dict[str, Any] | None = None,
        shuffle_over_epochs_multiplier: int | None = 1,
        dataset_config: str | None = None,
        split_config: str | None = None,
    ) -> None:
        self.path = _epath(path)
        self.split_part = split_part
        self.subflavors = subflavors
        self.shuffle_over_epochs_multiplier = shuffle_over_epochs_multiplier
        self.dataset_config = dataset_config
        self.split_config = split_config

    def _resolve_path(self) -> Any:
        return str(self.path)

    def get_dataset(
        self,
        *,
        training: bool,
        split_part: str | None = None,
        worker_config: WorkerConfig,
        subflavors: dict[str, Any] | None = None,
        shuffle_over_epochs: int | None = 1,
        split_config: str | None = None,
        dataset_config: str | None = None,
        subset: Any = None,
        **kwargs: Any,
    ) -> Any:
        from energon.compat.dataset_config import get_dataset_from_config

        return get_dataset_from_config(
            str(self.path),
            dataset_config=dataset_config or self.dataset_config,
            split_config=split_config or self.split_config,
            split_part=split_part or self.split_part or "train",
            training=training,
            subflavors={**(self.subflavors or {}), **(subflavors or {})},
            worker_config=worker_config,
            shuffle_over_epochs=shuffle_over_epochs,
            subset=subset,
            **kwargs,
        )

    def traverse(self, mds_path: Any = None, *, split_part: str, _subflavors: dict | None = None):
        return [
            TraversedDatasetReference(
                path=self.path,
                split_part=self.split_part or split_part,
                aux={},
                subflavors=dict(self.subflavors or {}),
            )
        ]


class Metadataset(DatasetLoaderInterface):
    """A V1 metadataset YAML (``splits: {split: {datasets: [...]}}``)."""

    def __init__(self, path: Any, splits: dict[str, Any]) -> None:
        self.path = _epath(path)
        self.splits = splits

    def _resolve_path(self) -> Any:
        return str(self.path)


class MetadatasetV2(DatasetLoaderInterface):
    """A V2 metadataset YAML (``__class__: MetadatasetV2``: blend, blend_epochized, join, subsets)."""

    def __init__(self, *, path: Any, splits: dict[str, Any]) -> None:
        self.path = _epath(path)
        self.splits = splits

    def _resolve_path(self) -> Any:
        return str(self.path)

    def prepare(self, split_part: str | None = None) -> Sequence[Any]:
        return prepare_metadataset(str(self.path), progress=False) or []


class MockJsonParser(JsonParser):
    """A ``JsonParser`` that accepts any data without checking it (the reference uses it to read
    a metadataset YAML's structure without building objects)."""

    def raw_to_typed(self, raw_data: Any, inst_type: Any, *args: Any, **kwargs: Any) -> Any:
        return raw_data


def _epath(path: Any) -> Any:
    from energon.compat.epathlib import EPath

    return EPath(path)


def load_dataset(path: Any, **kwargs: Any) -> DatasetLoaderInterface:
    """The loader of ``path``: a metadataset YAML, or a dataset directory / JSONL file."""
    text_path = epath.normalize(os.fspath(path) if not hasattr(path, "url") else str(path))
    if text_path.endswith(".yaml"):
        data = yaml.safe_load(epath.read_text(text_path)) or {}
        if kwargs:
            raise TypeError(
                f"unexpected arguments for a metadataset: {sorted(kwargs)} (set dataset_config / "
                "split_config on the references inside the metadataset)"
            )
        splits = data.get("splits", {}) if isinstance(data, dict) else {}
        if isinstance(data, dict) and data.get("__class__") == "MetadatasetV2":
            return MetadatasetV2(path=text_path, splits=splits)
        return Metadataset(text_path, splits)
    return DatasetLoader(path=text_path, **kwargs)


def traverse_metadataset(
    path: Any, *, split_part: str, **kwargs: Any
) -> list[TraversedDatasetReference]:
    """Leaves of one split of a metadataset (nested YAMLs followed, joins expanded into their
    members), without opening them: the core's references with ``EPath`` paths, as the
    reference gives them."""
    return [
        dataclasses.replace(
            ref, path=_epath(ref.path), aux={name: _epath(p) for name, p in ref.aux.items()}
        )
        for ref in core_traverse(epath.normalize(os.fspath(path)), split_part=split_part)
    ]


def _resolve_aux(kind: str, path: Any, mds_path: Any) -> EPath:
    """``path`` relative to the folder of the metadataset file ``mds_path`` (absolute paths stay)."""
    if mds_path is None:
        raise ValueError(f"{kind}.post_initialize needs the metadataset's path (mds_path)")
    return EPath(mds_path).parent / path


class AuxDatasetReference:
    """An aux entry naming a prepared dataset (random access by ``<key>.<part>``)."""

    def __init__(self, *, path: Any) -> None:
        self.path = path

    def post_initialize(self, mds_path: Any = None) -> None:
        """Resolve ``path`` against the metadataset's folder; it must be a prepared dataset."""
        self.path = _resolve_aux("AuxDatasetReference", self.path, mds_path)
        if not check_dataset_info_present(self.path):
            raise ValueError(
                f"auxiliary datasets must be prepared energon datasets: {self.path} does not "
                "exist or is not prepared (run `energon prepare` on it)"
            )

    def get_file_store(self) -> Any:
        from energon.source.file_store import WebdatasetFileStore

        return WebdatasetFileStore(str(self.path))


class AuxFilesystemReference:
    """An aux entry naming a folder (``filesystem://...``): files by relative path."""

    def __init__(self, *, fs_path: Any) -> None:
        self.fs_path = fs_path

    def post_initialize(self, mds_path: Any = None) -> None:
        """Resolve ``fs_path`` against the metadataset's folder."""
        self.fs_path = _resolve_aux("AuxFilesystemReference", self.fs_path, mds_path)

    def get_file_store(self) -> Any:
        from energon.source.file_store import SystemFileStore

        return SystemFileStore(str(self.fs_path))
