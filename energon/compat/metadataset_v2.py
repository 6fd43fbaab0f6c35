"""``megatron.energon.metadataset.metadataset_v2``: the reference's object model of a
``MetadatasetV2`` YAML (references, blends, epochized blends, joins, subsets) as typed records,
e.g. for ``JsonParser`` or code that builds a metadataset in Python. Loading a metadataset file
(``load_dataset``, ``get_train_dataset``) does not go through these classes: energon parses and
resolves the YAML itself (:mod:`energon.metadataset`). A reference or blend built here resolves its
datasets with energon's resolver (``get_datasets``); joins are built from a YAML ``join:``."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from energon import epath
from energon.compat.dataset_config import load_config
from energon.compat.epathlib import EPath
from energon.compat.join_dataset_loader import JoinDatasetLoader, JoinedDatasetInfo
from energon.compat.metadataset import (
    AuxDatasetReference,
    AuxFilesystemReference,
    DatasetBlendMode,
    DatasetLoader,
    DatasetLoaderInterface,
    LoadedDatasetList,
    Metadataset,
    MetadatasetV2,
)
from energon.compat.webdataset.metadata import EnergonDatasetType, get_dataset_type
from energon.compat.webdataset.structs import DatasetSubset
from energon.format.layout import INDEX_SQLITE_FILENAME, MAIN_FOLDER_NAME
from energon.metadataset.resolve import TraversedDatasetReference
from energon.samples.base import Sample
from energon.samples.edataclass import edataclass
from energon.source.file_store import FileStore, SystemFileStore, WebdatasetFileStore
from energon.worker import WorkerConfig

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "MAIN_FOLDER_NAME",
    "AuxDatasetReference",
    "AuxFilesystemReference",
    "BlendDatasetReference",
    "BlendEpochizedDatasetReference",
    "BlendEpochizedJoinDatasetReference",
    "BlendJoinDatasetReference",
    "BlendRepetitionsMixin",
    "BlendWeightMixin",
    "DatasetBlendMode",
    "DatasetLoader",
    "DatasetLoaderInterface",
    "DatasetReference",
    "DatasetSubset",
    "EPath",
    "EnergonDatasetType",
    "FileStore",
    "JoinDatasetLoader",
    "JoinDatasetReference",
    "JoinedDatasetInfo",
    "LoadedDatasetList",
    "Metadataset",
    "MetadatasetBlend",
    "MetadatasetBlendEpochized",
    "MetadatasetJoin",
    "MetadatasetV2",
    "Sample",
    "Subset",
    "SubsetRatioMixin",
    "SystemFileStore",
    "TraversedDatasetReference",
    "WebdatasetFileStore",
    "WorkerConfig",
    "edataclass",
    "get_dataset_type",
    "load_config",
]

_PERCENT = re.compile(r"^\s*([0-9.]+)\s*%\s*$")


def _fraction(value: float | int | str) -> float:
    match = _PERCENT.match(str(value))
    return float(match.group(1)) / 100 if match else float(value)


@dataclasses.dataclass(kw_only=True)
class Subset:
    """``subset: {range: [start, end]}``: a window of a dataset, as fractions (``"10%"``) or
    absolute sample counts."""

    range: tuple[float | int | str, float | int | str]  # noqa: A003 - the reference's name

    def as_dataset_subset(self) -> DatasetSubset:
        start, end = self.range
        if all(isinstance(v, str) and "%" in v for v in (start, end)):
            return DatasetSubset(range=(_fraction(start), _fraction(end)))
        return DatasetSubset(
            absolute_range=(int(start), None if end in (None, "end") else int(end))
        )

    def merge(self, parent_subset: Subset | None) -> Subset:
        """This window inside the parent's (relative windows compose)."""
        if parent_subset is None:
            return self
        p0, p1 = (_fraction(v) for v in parent_subset.range)
        s0, s1 = (_fraction(v) for v in self.range)
        span = p1 - p0
        return Subset(range=(f"{(p0 + s0 * span) * 100:g}%", f"{(p0 + s1 * span) * 100:g}%"))


@dataclasses.dataclass(kw_only=True)
class SubsetRatioMixin:
    subset: Subset | None = None


# weight / repetitions may be given by position (the only positional field), as the reference's
@dataclasses.dataclass
class BlendWeightMixin:
    weight: float = 1.0


@dataclasses.dataclass
class BlendRepetitionsMixin:
    repetitions: float = 1


@dataclasses.dataclass(kw_only=True)
class DatasetReference(SubsetRatioMixin, DatasetLoaderInterface):
    """One dataset (directory, JSONL file or nested metadataset YAML) of a metadataset."""

    path: str | EPath
    split_part: str | None = None
    subflavors: dict[str, Any] | None = None
    shuffle_over_epochs_multiplier: int | None = 1
    dataset_config: str | None = None  # None: dataset.yaml
    split_config: str | None = None  # None: split.yaml
    aux: dict[str, str] | None = None
    _dataset: Any = None

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        """Relative paths are relative to the metadataset's folder."""
        base = os.path.dirname(str(mds_path)) if mds_path is not None else os.getcwd()
        self.path = EPath(epath.resolve(os.fspath(self.path), base))

    def prepare(self, split_part: str | None = None) -> list[Any]:
        return []

    def _resolve_path(self) -> Any:
        return str(self.path)

    def traverse(
        self, mds_path: EPath | None = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        return DatasetLoader(
            path=self.path, split_part=self.split_part, subflavors=self.subflavors
        ).traverse(mds_path, split_part=split_part)


@dataclasses.dataclass(kw_only=True)
class JoinDatasetReference(DatasetReference):
    """A member of a join (``nonmatch``: what a missing sample does)."""

    nonmatch: str = "error"

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        raise NotImplementedError(
            "a join member is loaded with its join: describe the join in a metadataset YAML "
            "(join: / joiner:) and load that"
        )


@dataclasses.dataclass(kw_only=True)
class BlendDatasetReference(BlendWeightMixin, DatasetReference):
    pass


@dataclasses.dataclass(kw_only=True)
class BlendEpochizedDatasetReference(BlendRepetitionsMixin, DatasetReference):
    pass


@dataclasses.dataclass(kw_only=True)
class MetadatasetJoin(SubsetRatioMixin, DatasetLoaderInterface):
    """``join:`` members with a ``joiner``; loaded from a metadataset YAML (``prepare`` builds
    its index, ``energon prepare mix.yaml``)."""

    join: list[JoinDatasetReference] | dict[str, JoinDatasetReference]
    joiner: Any
    split_part: str | None = None
    subflavors: dict[str, Any] | None = None
    shuffle_over_epochs_multiplier: int | None = 1
    dataset_config: str | None = None  # None: dataset.yaml
    split_config: str | None = None  # None: split.yaml
    _dataset: Any = None

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        members = self.join.values() if isinstance(self.join, dict) else self.join
        for member in members:
            member.post_initialize(mds_path)

    def prepare(self, split_part: str | None = None) -> list[Any]:
        return []

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        raise NotImplementedError(
            "a join is loaded from its metadataset YAML (join: / joiner:); build it there and "
            "load it with load_dataset or get_train_dataset"
        )

    def traverse(
        self, mds_path: EPath | None = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        members = self.join.values() if isinstance(self.join, dict) else self.join
        return [ref for m in members for ref in m.traverse(mds_path, split_part=split_part)]


@dataclasses.dataclass(kw_only=True)
class BlendJoinDatasetReference(BlendWeightMixin, MetadatasetJoin):
    pass


@dataclasses.dataclass(kw_only=True)
class BlendEpochizedJoinDatasetReference(BlendRepetitionsMixin, MetadatasetJoin):
    pass


def _blended(
    entries: list[Any], mode: DatasetBlendMode, factor_of: Any, **kwargs: Any
) -> LoadedDatasetList:
    datasets = []
    for entry in entries:
        inner = entry.get_datasets(**kwargs)
        for loaded in inner.datasets:
            factor = factor_of(entry)
            if mode == DatasetBlendMode.DATASET_WEIGHT:
                loaded.weight = (loaded.weight if loaded.weight is not None else 1.0) * factor
            else:
                loaded.repetitions = (loaded.repetitions or 1) * factor
            datasets.append(loaded)
    return LoadedDatasetList(datasets=datasets, blend_mode=mode)


@dataclasses.dataclass(kw_only=True)
class MetadatasetBlend(SubsetRatioMixin, DatasetLoaderInterface):
    """``blend:`` entries drawn by weight."""

    blend: list[BlendDatasetReference | BlendJoinDatasetReference]

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        for entry in self.blend:
            entry.post_initialize(mds_path)

    def prepare(self, split_part: str | None = None) -> list[Any]:
        return []

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        return _blended(self.blend, DatasetBlendMode.DATASET_WEIGHT, lambda e: e.weight, **kwargs)

    def traverse(
        self, mds_path: EPath | None = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        return [r for e in self.blend for r in e.traverse(mds_path, split_part=split_part)]


@dataclasses.dataclass(kw_only=True)
class MetadatasetBlendEpochized(SubsetRatioMixin, DatasetLoaderInterface):
    """``blend_epochized:`` entries repeated a number of times per epoch."""

    blend_epochized: list[BlendEpochizedDatasetReference | BlendEpochizedJoinDatasetReference]

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        for entry in self.blend_epochized:
            entry.post_initialize(mds_path)

    def prepare(self, split_part: str | None = None) -> list[Any]:
        return []

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        return _blended(
            self.blend_epochized,
            DatasetBlendMode.SAMPLE_REPETITIONS,
            lambda e: e.repetitions,
            **kwargs,
        )

    def traverse(
        self, mds_path: EPath | None = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        return [
            r for e in self.blend_epochized for r in e.traverse(mds_path, split_part=split_part)
        ]
