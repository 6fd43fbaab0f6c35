"""``megatron.energon.media.filesystem_prepare``: media metadata for a plain folder (an aux
source), as ``energon prepare-media`` writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from energon.compat.epathlib import EPath
from energon.compat.webdataset.aggregator_pool import AggregatorPool
from energon.compat.webdataset.prepare import (
    INDEX_BATCH_SIZE,
    IndexAggregatable,
    IndexMediaMetadata,
    SqliteIndexWriterAggregator,
)
from energon.compat.webdataset.structs import ShardInfo
from energon.format.layout import INDEX_SQLITE_FILENAME, MAIN_FOLDER_NAME
from energon.format.media_metadata import serialize_media_metadata
from energon.media.extract import MediaFilterConfig
from energon.prepare.media import prepare_folder_media

__all__ = [
    "INDEX_BATCH_SIZE",
    "INDEX_SQLITE_FILENAME",
    "MAIN_FOLDER_NAME",
    "AggregatorPool",
    "EPath",
    "IndexAggregatable",
    "IndexMediaMetadata",
    "MediaFilterConfig",
    "ShardInfo",
    "SqliteIndexWriterAggregator",
    "prepare_filesystem_dataset",
    "serialize_media_metadata",
]


def prepare_filesystem_dataset(
    root_path: Any,
    media_filter: Any,
    *,
    progress: bool,
    workers: int = 16,
    index_sqlite_tmp_path: Path | None = None,
) -> int:
    """Write ``<root>/.nv-meta/index.sqlite`` with the media metadata of the folder's files;
    returns the number of files described. (``index_sqlite_tmp_path`` is not needed: the index is
    written next to its final place and renamed.)"""
    return prepare_folder_media(
        str(root_path), media_filter, num_workers=workers, progress=progress
    )
