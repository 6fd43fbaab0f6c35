"""``megatron.energon.tools.preview``: ``energon preview`` (``command``)."""

from __future__ import annotations

from energon.cli.preview import command
from energon.compat.dataset_config import load_config
from energon.compat.epathlib import EPath
from energon.compat.flavors import StandardWebdatasetFactory
from energon.errors import EmptyDatasetError
from energon.format.layout import MAIN_FOLDER_NAME
from energon.loader.data_loader import get_loader
from energon.samples.base import Sample
from energon.worker import WorkerConfig

__all__ = [
    "MAIN_FOLDER_NAME",
    "EPath",
    "EmptyDatasetError",
    "Sample",
    "StandardWebdatasetFactory",
    "WorkerConfig",
    "command",
    "get_loader",
    "load_config",
]
