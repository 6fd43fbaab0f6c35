"""``megatron.energon.metadataset.metadataset``: the object model of a V1 ``Metadataset`` YAML
(``splits: {train: {datasets: [{weight, path, ...}]}}``) as typed records; loading a V1 file goes
through energon's resolver (:mod:`energon.metadataset`), like V2."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.compat.dataset_config import load_config
from energon.compat.deprecation import warn_deprecated
from energon.compat.epathlib import EPath
from energon.compat.metadataset import (
    DatasetBlendMode,
    DatasetLoader,
    DatasetLoaderInterface,
    LoadedDatasetList,
    Metadataset,
)
from energon.compat.metadataset_v2 import DatasetReference as _V2Reference
from energon.compat.metadataset_v2 import _blended
from energon.compat.webdataset.metadata import check_dataset_info_present
from energon.compat.webdataset.structs import DatasetSubset
from energon.metadataset.resolve import TraversedDatasetReference
from energon.samples.edataclass import edataclass
from energon.worker import WorkerConfig

__all__ = [
    "DatasetBlendMode",
    "DatasetLoader",
    "DatasetLoaderInterface",
    "DatasetReference",
    "DatasetSubset",
    "EPath",
    "LoadedDatasetList",
    "Metadataset",
    "MetadatasetBlender",
    "TraversedDatasetReference",
    "WorkerConfig",
    "check_dataset_info_present",
    "edataclass",
    "load_config",
    "warn_deprecated",
]


@dataclasses.dataclass(kw_only=True)
class DatasetReference(_V2Reference):
    """A dataset of a V1 split, with its blend ``weight`` and (deprecated) single ``subflavor``."""

    subflavor: str | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.subflavor is not None:
            warn_deprecated("DatasetReference.subflavor is deprecated; use subflavors")
            self.subflavors = {**(self.subflavors or {}), "__subflavor__": self.subflavor}


@dataclasses.dataclass(kw_only=True)
class MetadatasetBlender(DatasetLoaderInterface):
    """The datasets of a V1 split, blended by weight."""

    datasets: list[DatasetReference]

    def post_initialize(self, mds_path: EPath | None = None) -> None:
        for dataset in self.datasets:
            dataset.post_initialize(mds_path)

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        return _blended(
            self.datasets, DatasetBlendMode.DATASET_WEIGHT, lambda d: d.weight, **kwargs
        )

    def traverse(
        self, mds_path: EPath | None = None, *, split_part: str, _subflavors: dict | None = None
    ) -> list[TraversedDatasetReference]:
        return [r for d in self.datasets for r in d.traverse(mds_path, split_part=split_part)]
