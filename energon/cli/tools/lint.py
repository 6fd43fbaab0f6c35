"""``megatron.energon.tools.lint``: ``energon lint`` (``command``) and its index check."""

from __future__ import annotations

from energon.cli.lint import command
from energon.compat.epathlib import EPath
from energon.compat.webdataset.itar import TarIndexReader
from energon.compat.webdataset.metadata import get_dataset_info
from energon.errors import EmptyDatasetError
from energon.loader.build import get_val_dataset
from energon.loader.data_loader import get_loader
from energon.worker import WorkerConfig

__all__ = [
    "EPath",
    "EmptyDatasetError",
    "TarIndexReader",
    "WorkerConfig",
    "check_index",
    "command",
    "get_dataset_info",
    "get_loader",
    "get_val_dataset",
]


def check_index(dataset_path: EPath) -> None:
    """Check that every shard's ``.tar.idx`` has as many samples as ``.info.json`` says and
    that its last offset is the shard's size; raises ``ValueError`` naming the shard."""
    import os

    root = EPath(dataset_path)
    for shard, count in get_dataset_info(root)["shard_counts"].items():
        index = TarIndexReader(root / shard)
        if len(index) != count + 1:
            raise ValueError(
                f"{shard}: the tar index has {len(index) - 1} samples, .info.json says {count}"
            )
        size = os.path.getsize(str(root / shard)) if root.is_local() else (root / shard).size()
        if index[len(index) - 1] > size:
            raise ValueError(
                f"{shard}: the tar index ends at {index[len(index) - 1]}, beyond the shard ({size} bytes)"
            )
