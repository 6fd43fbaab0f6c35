"""``megatron.energon.dataset_config``: ``get_dataset_from_config`` (a dataset directory or JSONL
file as the factory its ``dataset.yaml`` describes) and ``load_config``."""

from __future__ import annotations

import os
from typing import Any

import yaml

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.eyaml import load_yaml
from energon.compat.flavors import (
    BaseCoreDatasetFactory,
    CrudeWebdataset,
    DefaultCrudeJsonlDatasetFactory,
    StandardWebdatasetFactory,
    _open_webdataset_source,
)
from energon.compat.typed_converter import JsonParser
from energon.compat.webdataset.metadata import EnergonDatasetType, get_dataset_type
from energon.decode import SampleDecoder
from energon.format.layout import DATASET_YAML_FILENAME, MAIN_FOLDER_NAME
from energon.samples.base import CrudeSample
from energon.source.dataset_config import load_sample_builder
from energon.worker import WorkerConfig

__all__ = [
    "MAIN_FOLDER_NAME",
    "CrudeSample",
    "EPath",
    "EnergonDatasetType",
    "JsonParser",
    "get_dataset_from_config",
    "get_dataset_type",
    "load_config",
    "load_yaml",
]


def get_dataset_from_config(
    path: Any,
    *,
    dataset_config: str | None = None,
    split_config: str | None = None,
    split_part: str | None = None,
    training: bool = True,
    subflavors: dict[str, Any] | None = None,
    worker_config: WorkerConfig,
    sample_type: type | None = None,
    **kwargs: Any,
) -> BaseCoreDatasetFactory:
    """The factory for ``path``: JSONL -> crude JSONL factory; a prepared dataset -> the factory of
    its ``.nv-meta/<dataset_config>`` (metadataset subflavors win over the yaml's)."""
    root = epath.normalize(os.fspath(path) if not hasattr(path, "url") else str(path))
    if root.endswith(".jsonl"):
        if dataset_config is not None or split_config is not None:
            raise ValueError("a JSONL dataset has no dataset_config or split_config")
        factory: BaseCoreDatasetFactory = DefaultCrudeJsonlDatasetFactory(
            root, training=training, worker_config=worker_config, **kwargs
        )
    else:
        builder = load_sample_builder(root, dataset_config or DATASET_YAML_FILENAME)
        source = _open_webdataset_source(
            root,
            split_part=split_part or "train",
            builder=builder,
            split_config=split_config or builder.split_config,
            subset=kwargs.pop("subset", None),
        )
        cls = CrudeWebdataset if builder.kind == "crude" else StandardWebdatasetFactory
        factory = cls.from_source(
            source,
            training=training,
            worker_config=worker_config,
            shuffle_over_epochs=kwargs.pop("shuffle_over_epochs", 1),
            parallel_shard_iters=kwargs.pop("parallel_shard_iters", None),
            max_samples_per_sequence=kwargs.pop("max_samples_per_sequence", None),
            decoder=kwargs.pop("decoder", SampleDecoder()),
        )
        if builder.kind != "crude":
            factory.__sample_type__ = builder.sample_type
        if kwargs:
            raise TypeError(f"get_dataset_from_config: unexpected arguments {sorted(kwargs)}")
    factory.subflavors.update(subflavors or {})
    if sample_type is not None:
        produced = factory.__sample_type__
        if produced is not None and not issubclass(produced, sample_type):
            raise TypeError(f"{root} yields {produced.__name__}, not {sample_type.__name__}")
    return factory


def load_config(
    path: Any,
    *,
    default_type: type,
    default_kwargs: dict[str, Any] | None = None,
    parser: Any = None,
) -> Any:
    """An object of ``default_type`` from a YAML/JSON file or dict (``default_kwargs`` underneath)."""
    if isinstance(path, dict):
        data = dict(path)
    else:
        data = yaml.safe_load(epath.read_text(epath.normalize(str(path)))) or {}
    data.pop("__module__", None)
    data.pop("__class__", None)
    return default_type(**{**(default_kwargs or {}), **data})
