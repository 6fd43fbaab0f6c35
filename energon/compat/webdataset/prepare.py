"""``megatron.energon.flavors.webdataset.prepare``: programmatic preparation of a WebDataset.

``WebdatasetPreparator.prepare_dataset`` (also reachable as ``BaseWebdatasetFactory.prepare_dataset``,
as in the reference's "Programmatic Data Preparation" example) runs energon's preparation
(:func:`energon.prepare.dataset.prepare_dataset`), which writes exactly what ``energon prepare``
writes: the ``.tar.idx`` files, ``.nv-meta/index.sqlite``, ``index.uuid``, the split config and
``.info.json`` (no ``dataset.yaml``: scripts copy or write their own, as with the reference).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Generator, Iterator
from pathlib import Path
from typing import Any

from energon import epath
from energon.compat.bracecollapse import collapse
from energon.compat.epathlib import EPath
from energon.compat.eyaml import load_yaml
from energon.compat.typed_converter import to_json_object
from energon.compat.webdataset.aggregator_pool import AggregatorPool, BaseAggregator
from energon.compat.webdataset.indexing import (
    IndexAggregatable,
    IndexMediaMetadata,
    IndexSample,
    IndexSamplePart,
    IndexShardInfo,
    SqliteIndexWriter,
)
from energon.compat.webdataset.itar import TarIndexWriter
from energon.compat.webdataset.metadata import get_dataset_info
from energon.compat.webdataset.structs import ShardInfo, WebdatasetInfo, WebdatasetSplits
from energon.errors import DuplicateSampleKeyError
from energon.format.layout import (
    INDEX_SQLITE_FILENAME,
    INDEX_UUID_FILENAME,
    INFO_JSON_FILENAME,
    INFO_YAML_FILENAME,
    MAIN_FOLDER_NAME,
    SPLIT_YAML_FILENAME,
)
from energon.format.media_metadata import serialize_media_metadata
from energon.format.tar import iter_tar_members, split_member_name
from energon.media.extract import MediaFilterConfig
from energon.prepare.dataset import prepare_dataset as prepare_webdataset
from energon.samples.edataclass import edataclass

__all__ = [
    "INDEX_BATCH_SIZE",
    "INDEX_SQLITE_FILENAME",
    "INDEX_UUID_FILENAME",
    "INFO_JSON_FILENAME",
    "INFO_YAML_FILENAME",
    "MAIN_FOLDER_NAME",
    "AggregatorPool",
    "BaseAggregator",
    "DuplicateSampleKeyError",
    "EPath",
    "IndexAggregatable",
    "IndexMediaMetadata",
    "IndexSample",
    "IndexSamplePart",
    "IndexShardInfo",
    "MediaFilterConfig",
    "ShardInfo",
    "SqliteIndexWriter",
    "SqliteIndexWriterAggregator",
    "TarIndexWriter",
    "WebdatasetInfo",
    "WebdatasetPreparator",
    "WebdatasetSplits",
    "collapse",
    "edataclass",
    "get_dataset_info",
    "load_yaml",
    "serialize_media_metadata",
    "to_json_object",
]

INDEX_BATCH_SIZE = 4096  # rows per insert batch


class SqliteIndexWriterAggregator(BaseAggregator):
    """Writes the rows the preparation workers send into ``index.sqlite``; the result is the
    shard infos received and every part name seen."""

    def __init__(
        self,
        sqlite_path: EPath,
        total_tasks: int,
        progress_fn: Callable[[Iterator[Any], int], Iterator[Any]] | None = None,
        enable_sample_tables: bool = True,
        enable_media_metadata: bool = False,
        media_filter: MediaFilterConfig | None = None,
        reset_tables: bool = True,
        progress_on_media: bool = False,
        sqlite_local_build_path: Path | None = None,
    ) -> None:
        self.sqlite_path = sqlite_path
        self.total_tasks = total_tasks
        self.progress_fn = progress_fn
        self.enable_sample_tables = enable_sample_tables
        self.enable_media_metadata = enable_media_metadata
        self.media_filter = media_filter
        self.reset_tables = reset_tables
        self.shards: list[ShardInfo] = []
        self.found_parts: set[str] = set()
        self.writer: SqliteIndexWriter | None = None

    def on_start(self, aggregator_pool: AggregatorPool) -> None:
        self.writer = SqliteIndexWriter(
            self.sqlite_path,
            enable_sample_tables=self.enable_sample_tables,
            enable_media_metadata=self.enable_media_metadata,
            reset_tables=self.reset_tables,
        )
        if self.media_filter is not None:
            self.writer.append_media_filter(
                strategy=self.media_filter.strategy.value,
                patterns=self.media_filter.patterns_column,
            )

    def on_item(self, items: list[IndexAggregatable], aggregator_pool: AggregatorPool) -> None:
        assert self.writer is not None
        for kind, write in (
            (IndexSample, self.writer.append_samples),
            (IndexSamplePart, self.writer.append_parts),
            (IndexMediaMetadata, self.writer.append_media_metadata_batch),
        ):
            rows = [item for item in items if isinstance(item, kind)]
            if rows:
                write(rows)
        for item in items:
            if isinstance(item, IndexShardInfo):
                self.shards.append(item.shard_info)
                self.found_parts |= set(item.parts)

    def on_finish(self, aggregator_pool: AggregatorPool) -> None:
        if self.writer is not None:
            self.writer.close()

    def get_final_result_data(self) -> tuple[list[ShardInfo], set[str]]:
        return self.shards, self.found_parts


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
        from energon.prepare.media import prepare_webdataset_media

        return prepare_webdataset_media(
            os.fspath(parent_path), media_filter, num_workers=_workers(workers), progress=False
        )
