"""``megatron.energon.media.filesystem_prepare``: media metadata for a plain folder (an aux
source), as ``energon prepare-media`` writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from energon.media.prepare import prepare_folder_media

__all__ = ["prepare_filesystem_dataset"]


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
