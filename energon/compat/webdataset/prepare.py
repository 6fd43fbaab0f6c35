"""``megatron.energon.flavors.webdataset.prepare``: programmatic preparation of a WebDataset.

``WebdatasetPreparator.prepare_dataset`` (also reachable as ``BaseWebdatasetFactory.prepare_dataset``,
as in the reference's "Programmatic Data Preparation" example) runs energon's preparation
(:func:`energon.format.prepare.prepare_dataset`), which writes exactly what ``energon prepare``
writes: the ``.tar.idx`` files, ``.nv-meta/index.sqlite``, ``index.uuid``, the split config and
``.info.json`` (no ``dataset.yaml``: scripts copy or write their own, as with the reference).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Generator, Iterator
from pathlib import Path
from typing import Any

from energon import epath
from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    INDEX_UUID_FILENAME,
    INFO_JSON_FILENAME,
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
)
from energon.format.prepare import prepare_dataset as prepare_webdataset
from energon.format.tar import iter_tar_members, split_member_name
from energon.media.extract import MediaFilterConfig

__all__ = [
    "INDEX_SQLITE_FILENAME",
    "INDEX_UUID_FILENAME",
    "INFO_JSON_FILENAME",
    "MAIN_FOLDER_NAME",
    "MediaFilterConfig",
    "WebdatasetPreparator",
]


def _workers(requested: int) -> int:
    """The reference defaults to 32 processes; more than the machine's cores only costs."""
    return max(1, min(requested, os.cpu_count() or 1))


def _iter_tar_parts(path: str, extract_keys: Container[str]) -> Iterator[dict[str, Any]]:
    local = epath.local_copy(path) if epath.is_remote(path) else path
    with open(local, "rb") as f:
        sample: dict[str, Any] = {}
        current: str | None = None
        for member in iter_tar_members(f, path=path):
            split = split_member_name(member.name) if member.is_file else None
            if split is None:
                continue
            key, part = split
            if key != current and sample:
                yield sample
                sample = {}
            current = key
            data = None
            if part in extract_keys:
                f.seek(member.data_offset)
                data = f.read(member.size)
            sample[part] = data
        if sample:
            yield sample


class WebdatasetPreparator:
    """Preparation of WebDataset shards (``energon prepare`` as Python)."""

    @staticmethod
    def iter_dataset_content(
        path: Any, extract_keys: Container[str] = ()
    ) -> Generator[dict[str, Any], None, None]:
        """Each sample of the tar shard ``path`` as ``{part name: bytes or None}``: the content
        of the parts named in ``extract_keys``, None for the others."""
        yield from _iter_tar_parts(epath.normalize(os.fspath(path)), extract_keys)

    @classmethod
    def prepare_dataset(
        cls,
        parent_path: Path | Any,
        paths: list[str],
        *,
        split_parts_ratio: list[tuple[str, float]] | None = None,
        split_parts_patterns: list[tuple[str, str]] | None = None,
        split_config: str = SPLIT_YAML_FILENAME,
        shuffle_seed: int | None = 42,
        progress_fn: Callable[[Iterator[Any], int], Iterator[Any]] = lambda x, y: x,
        workers: int = 32,
        tar_index_only: bool = False,
        media_filter: MediaFilterConfig | None = None,
        fix_duplicates: bool = False,
        index_sqlite_tmp_path: Path | None = None,
    ) -> set[str]:
        """Index the shards ``paths`` (relative to ``parent_path``) and write ``.nv-meta``.
        Returns the part names found (at most 50). ``progress_fn`` is accepted; energon shows
        its own progress only when asked (``energon prepare --progress``)."""
        if fix_duplicates:
            raise NotImplementedError(
                "fix_duplicates is not supported: make sample keys unique (e.g. prefix member names "
                "with the shard name) and prepare again"
            )
        result = prepare_webdataset(
            epath.normalize(os.fspath(parent_path)),
            list(paths),
            split_parts_ratio=split_parts_ratio,
            split_parts_patterns=split_parts_patterns,
            split_config=split_config,
            shuffle_seed=shuffle_seed,
            num_workers=_workers(workers),
            tar_index_only=tar_index_only,
            progress=False,
            tmp_path=None if index_sqlite_tmp_path is None else Path(index_sqlite_tmp_path).parent,
            media_filter=media_filter,
        )
        return set(result.part_names)

    @classmethod
    def add_media_metadata(
        cls,
        parent_path: Path | Any,
        *,
        media_filter: MediaFilterConfig,
        workers: int = 32,
        progress_fn: Callable[[Iterator[Any], int], Iterator[Any]] = lambda x, y: x,
        index_sqlite_tmp_path: Path | None = None,
    ) -> int:
        """Add (or refresh) media metadata in a prepared dataset's index; returns the count."""
        from energon.media.prepare import prepare_webdataset_media

        return prepare_webdataset_media(
            os.fspath(parent_path), media_filter, num_workers=_workers(workers), progress=False
        )
