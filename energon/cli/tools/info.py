"""``megatron.energon.tools.info``: ``energon info`` (``command``) and its helpers."""

from __future__ import annotations

from energon.cli.info import command
from energon.compat.epathlib import EPath
from energon.compat.eyaml import load_yaml, load_yaml_json
from energon.compat.flavors import BaseCoreDatasetFactory
from energon.compat.webdataset.metadata import get_dataset_info
from energon.format.layout import MAIN_FOLDER_NAME

__all__ = [
    "MAIN_FOLDER_NAME",
    "BaseCoreDatasetFactory",
    "EPath",
    "command",
    "fmt_size",
    "get_dataset_info",
    "load_yaml",
    "load_yaml_json",
]


def fmt_size(size: int) -> str:
    """``1.46 KiB``: bytes in binary units with two decimals."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
