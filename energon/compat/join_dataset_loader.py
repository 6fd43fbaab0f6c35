"""``megatron.energon.metadataset.join_dataset_loader``: the loader of a join. energon builds a join
from a metadataset YAML (``join:`` / ``joiner:``, index prepared by ``energon prepare mix.yaml``,
:mod:`energon.format.join_index`); these records carry the reference's fields for code that names
them, and ``JoinDatasetLoader`` says how to load a join."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.compat.epathlib import EPath
from energon.compat.flavors import (
    BaseCoreDatasetFactory,
    BaseWebdatasetFactory,
    JoinedWebdatasetFactory,
)
from energon.compat.metadataset import (
    DatasetBlendMode,
    DatasetLoader,
    DatasetLoaderInterface,
    LoadedDataset,
    LoadedDatasetList,
)
from energon.compat.webdataset.indexing import JoinIndexWriter
from energon.compat.webdataset.metadata import WebdatasetMeta
from energon.compat.webdataset.structs import DatasetSubset
from energon.format.layout import INDEX_SQLITE_FILENAME, INDEX_UUID_FILENAME, MAIN_FOLDER_NAME
from energon.samples.base import Sample
from energon.samples.edataclass import edataclass
from energon.worker import WorkerConfig

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "INDEX_UUID_FILENAME",
    "MAIN_FOLDER_NAME",
    "BaseCoreDatasetFactory",
    "BaseWebdatasetFactory",
    "DatasetBlendMode",
    "DatasetLoader",
    "DatasetLoaderInterface",
    "DatasetSubset",
    "EPath",
    "JoinDatasetLoader",
    "JoinIndexWriter",
    "JoinedDatasetInfo",
    "JoinedDatasetMetaInfo",
    "JoinedWebdatasetFactory",
    "LoadedDataset",
    "LoadedDatasetList",
    "Sample",
    "WebdatasetMeta",
    "WorkerConfig",
    "edataclass",
]


@edataclass
class JoinedDatasetInfo:
    """A member of a join and what a missing sample does (``nonmatch``)."""

    dataset: DatasetLoader
    nonmatch: str


@edataclass
class JoinedDatasetMetaInfo:
    """What the join index of one member was built from."""

    db_path: EPath
    uuid: str
    excludes: list[str]
    shard_name_to_info_idx: dict[str, int]
    split_part_oder: list[str]
    nonmatch: str


@dataclasses.dataclass(kw_only=True)
class JoinDatasetLoader(DatasetLoaderInterface):
    """A join of ``datasets`` by ``joiner``."""

    datasets: list[JoinedDatasetInfo] | dict[str, JoinedDatasetInfo]
    joiner: Any
    cache_path: EPath | None = None
    split_part: str | None = None
    split_config: str | None = None
    subflavors: dict[str, Any] | None = None
    shuffle_over_epochs_multiplier: int | None = 1

    def _how(self) -> NotImplementedError:
        return NotImplementedError(
            "energon loads a join from its metadataset YAML (join: / joiner:, index built by "
            "`energon prepare mix.yaml`): load that file with load_dataset or get_train_dataset"
        )

    def prepare(self, split_part: str | None = None) -> list[Any]:
        raise self._how()

    def get_dataset(self, **kwargs: Any) -> Any:
        raise self._how()

    def get_datasets(self, **kwargs: Any) -> LoadedDatasetList:
        raise self._how()
