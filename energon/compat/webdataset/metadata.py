"""``megatron.energon.flavors.webdataset.metadata``: what kind of dataset a path is, and the
``.info.json`` / split config of a prepared WebDataset, read through energon's format layer."""

from __future__ import annotations

import enum
import os
from typing import Any

from energon import epath
from energon.compat.epathlib import EPath
from energon.compat.eyaml import load_yaml, load_yaml_json
from energon.compat.typed_converter import JsonParser
from energon.compat.webdataset.structs import (
    ShardInfo,
    WebdatasetInfo,
    WebdatasetSplits,
)
from energon.errors import EmptyDatasetError
from energon.format.info import has_info, read_info
from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
)
from energon.format.split import read_split
from energon.samples.edataclass import edataclass

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "INFO_JSON_FILENAME",
    "INFO_YAML_FILENAME",
    "MAIN_FOLDER_NAME",
    "EPath",
    "EmptyDatasetError",
    "EnergonDatasetType",
    "JsonParser",
    "ShardInfo",
    "WebdatasetInfo",
    "WebdatasetMeta",
    "WebdatasetSplits",
    "check_dataset_info_present",
    "edataclass",
    "get_dataset_info",
    "get_dataset_type",
    "get_info_shard_files",
    "load_yaml",
    "load_yaml_json",
]


class EnergonDatasetType(enum.Enum):
    METADATASET = "metadataset"
    WEBDATASET = "webdataset"
    JSONL = "jsonl"
    FILESYSTEM = "filesystem"
    INVALID = "invalid"


def _path(path: Any) -> str:
    return epath.normalize(os.fspath(path))


def check_dataset_info_present(path: EPath) -> bool:
    """Whether ``path`` is a prepared WebDataset (has ``.nv-meta/.info.json`` or ``.info.yaml``)."""
    return has_info(_path(path))


def get_dataset_info(path: EPath) -> dict:
    """``.info.json`` of a prepared WebDataset as a dict (``energon_version``, ``shard_counts``)."""
    root = _path(path)
    for name in (INFO_JSON_FILENAME, INFO_YAML_FILENAME):
        file = epath.join(root, MAIN_FOLDER_NAME, name)
        if epath.exists(file):
            return load_yaml_json(EPath(file))
    raise EmptyDatasetError(
        f"{root} is not a prepared dataset (no {MAIN_FOLDER_NAME}/{INFO_JSON_FILENAME})"
    )


def get_info_shard_files(path: EPath) -> list[str]:
    """The shard names of ``.info.json``, in its order."""
    return list(read_info(_path(path)))


def get_dataset_type(path: EPath) -> EnergonDatasetType:
    """A metadataset YAML, a JSONL file, a prepared WebDataset, a prepared media folder
    (filesystem dataset) or none of them."""
    root = _path(path)
    if root.endswith((".yaml", ".yml")) and epath.is_file(root):
        return EnergonDatasetType.METADATASET
    if root.endswith(".jsonl") and epath.is_file(root):
        return EnergonDatasetType.JSONL
    if epath.is_dir(root):
        if has_info(root):
            return EnergonDatasetType.WEBDATASET
        if epath.exists(epath.join(root, MAIN_FOLDER_NAME, INDEX_SQLITE_FILENAME)):
            return EnergonDatasetType.FILESYSTEM
    return EnergonDatasetType.INVALID


@edataclass
class WebdatasetMeta:
    """The shards of one split of a prepared WebDataset, and what it excludes."""

    sample_excludes: set[str]
    shards: list[ShardInfo]
    split_part_files: list[str]
    info_shard_files: list[str]

    @staticmethod
    def from_config(
        path: EPath, *, split_part: str, split_config: str | None = None
    ) -> WebdatasetMeta:
        root = _path(path)
        counts = read_info(root)
        split = read_split(root, split_config or SPLIT_YAML_FILENAME)
        files = split.shards(split_part)
        return WebdatasetMeta(
            sample_excludes={f"{shard}/{key}" for shard, key in split.sample_excludes()},
            shards=[
                ShardInfo(name=name, path=EPath(epath.join(root, name)), count=counts[name])
                for name in files
            ],
            split_part_files=files,
            info_shard_files=list(counts),
        )
