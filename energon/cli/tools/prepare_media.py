"""``megatron.energon.tools.prepare_media``: ``energon prepare-media`` (``command``)."""

from __future__ import annotations

from energon.cli.prepare_media import command
from energon.compat.epathlib import EPath
from energon.compat.filesystem_prepare import prepare_filesystem_dataset
from energon.compat.webdataset.metadata import EnergonDatasetType, get_dataset_type
from energon.compat.webdataset.prepare import WebdatasetPreparator
from energon.media.extract import MediaFilterConfig

__all__ = [
    "EPath",
    "EnergonDatasetType",
    "MediaFilterConfig",
    "WebdatasetPreparator",
    "command",
    "get_dataset_type",
    "prepare_filesystem_dataset",
]
