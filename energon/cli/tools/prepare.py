"""``megatron.energon.tools.prepare``: ``energon prepare`` (``command``) and its helpers."""

from __future__ import annotations

import typing
from typing import Any

from energon.cli.prepare import command
from energon.compat.epathlib import EPath
from energon.compat.flavors import BaseWebdatasetFactory, CrudeJsonlDatasetFactory, CrudeWebdataset
from energon.compat.metadataset import prepare_metadataset
from energon.compat.webdataset.metadata import (
    EnergonDatasetType,
    check_dataset_info_present,
    get_dataset_info,
    get_dataset_type,
)
from energon.format.layout import MAIN_FOLDER_NAME
from energon.media.extract import MediaFilterConfig
from energon.samples.base import Sample

__all__ = [
    "MAIN_FOLDER_NAME",
    "BaseWebdatasetFactory",
    "CrudeJsonlDatasetFactory",
    "CrudeWebdataset",
    "EPath",
    "EnergonDatasetType",
    "MediaFilterConfig",
    "Sample",
    "check_dataset_info_present",
    "command",
    "get_dataset_info",
    "get_dataset_type",
    "prepare_metadataset",
    "printify_json",
    "type_str",
]

_MAX_STR = 25


def printify_json(data: Any) -> Any:
    """``data`` for printing: strings cut to 25 characters, containers converted recursively."""
    if isinstance(data, dict):
        return {key: printify_json(value) for key, value in data.items()}
    if isinstance(data, list):
        return [printify_json(value) for value in data]
    if isinstance(data, str) and len(data) > _MAX_STR:
        return data[:_MAX_STR] + "..."
    return data


def type_str(tp: Any) -> str:
    """A type as it reads in code: ``int``, ``typing.List[int]``."""
    if isinstance(tp, type) and typing.get_origin(tp) is None and tp.__module__ == "builtins":
        return tp.__name__
    return repr(tp)
