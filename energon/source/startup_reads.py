"""What a rank reads at start-up, counted without reading it (``energon simulate`` reports it
per rank).

A rank opens every prepared WebDataset split it reads, as
:func:`energon.format.split_shards.open_split_shards` does, and then reads the index of its own
share:

- the **summary**, the same on every rank whatever the dataset's size: its dataset config, and,
  with a current shard table, ``index.uuid``, the split config and the table's front part
  (header, per-split summaries); without a table ``.info.json`` and the split config, in full
  (:func:`~energon.format.split_shards.startup_summary`);
- its **own** part: the shard-table blocks that hold its shards and the directory entries of
  their pages (read when its streams are planned) and each of its shards' ``.tar.idx``, plus
  the checksum file for a dataset prepared with ``--checksums`` (read as its streams reach
  them; a remote index is fetched whole, a local one is memory-mapped and its pages read as
  they are touched).

A rank's shards are those that overlap the sample ranges of its logical streams; each is counted
once per rank. The samples' own bytes are not counted: they are the data, not the index.
``tests/preflight/test_startup_reads.py`` checks the figure against what a real rank asks the
loopback S3 server for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon import epath
from energon.format.checksums import checksums_size
from energon.format.layout import MAIN_FOLDER_NAME
from energon.format.shard_table import SplitTable
from energon.format.split_shards import startup_summary
from energon.format.tar_index import tar_index_size
from energon.source.webdataset import WebdatasetLeaf


@dataclass
class LeafReads:
    """What a rank reads of one leaf: ``summary`` (file in ``.nv-meta`` -> bytes) on every rank,
    and per shard ``shard_bytes`` (its index files) and, with a shard table, per block of
    ``block_shards`` shards ``block_bytes`` and per page of ``page_blocks`` blocks
    ``page_bytes`` (its directory entries; 0 where the summary lists every block)."""

    summary: dict[str, int]
    starts: np.ndarray  # first sample of each shard, then the sample count
    shard_bytes: np.ndarray
    block_shards: int = 0  # 0: no shard table
    block_bytes: np.ndarray | None = None
    page_blocks: int = 1
    page_bytes: np.ndarray | None = None

    @classmethod
    def of(cls, leaf: Any, starts: np.ndarray) -> LeafReads | None:
        """The reads of ``leaf`` (``starts``: its :attr:`starts`); None for leaves that are not
        a prepared WebDataset split (not counted)."""
        if not isinstance(leaf, WebdatasetLeaf):
            return None
        summary = {
            f"{MAIN_FOLDER_NAME}/{leaf.dataset_config}": _dataset_config_size(leaf),
            **{
                f"{MAIN_FOLDER_NAME}/{name}": size
                for name, size in startup_summary(leaf.root, leaf.split_config).items()
            },
        }
        counts = np.diff(starts)
        shard_bytes = tar_index_size(counts) + (checksums_size(counts) if leaf.checksums else 0)
        shard_bytes[counts == 0] = 0  # never opened
        if isinstance(leaf.shards, SplitTable):
            table = leaf.shards
            blocks, pages = table.read_costs()
            return cls(
                summary, starts, shard_bytes, table.block_shards, blocks, table.page_blocks, pages
            )
        return cls(summary, starts, shard_bytes)

    @property
    def summary_bytes(self) -> int:
        return sum(self.summary.values())

    def own_bytes(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Bytes a rank reads of its own shards, its streams reading the samples ``[a, b)`` of
        each of ``ranges``."""
        shards = _union(self._shards_of(a, b) for a, b in ranges if b > a)
        total = _covered(self.shard_bytes, shards)
        if self.block_shards:
            assert self.block_bytes is not None and self.page_bytes is not None
            blocks = _union(
                (a // self.block_shards, (b - 1) // self.block_shards + 1) for a, b in shards
            )
            pages = _union(
                (a // self.page_blocks, (b - 1) // self.page_blocks + 1) for a, b in blocks
            )
            total += _covered(self.block_bytes, blocks) + _covered(self.page_bytes, pages)
        return total

    def _shards_of(self, first: int, end: int) -> tuple[int, int]:
        """The shards ``[a, b)`` that hold samples ``[first, end)``."""
        a = int(np.searchsorted(self.starts[:-1], first, side="right")) - 1
        b = int(np.searchsorted(self.starts[:-1], end, side="left"))
        return a, b


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open intervals merged where they overlap, in order."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _covered(sizes: np.ndarray, intervals: Sequence[tuple[int, int]]) -> int:
    return sum(int(sizes[a:b].sum()) for a, b in intervals)


def _dataset_config_size(leaf: WebdatasetLeaf) -> int:
    size, _ = epath.stat(epath.join(leaf.root, MAIN_FOLDER_NAME, leaf.dataset_config))
    return size
