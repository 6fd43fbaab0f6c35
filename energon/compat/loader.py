"""``megatron.energon.loader``: ``get_loader`` / ``get_savable_loader`` (energon's loaders) with the
names the reference's module also offers."""

from __future__ import annotations

from energon.compat.cache import CachePool
from energon.compat.deprecation import warn_deprecated
from energon.compat.wrappers.gc_dataset import GC_DEFAULT_EVERY_N_ITER
from energon.loader.data_loader import (
    BasicDataLoader,
    SavableDataLoader,
    get_loader,
    get_savable_loader,
)
from energon.loader.savable_dataset import SavableDataset
from energon.worker import WorkerConfig

__all__ = [
    "GC_DEFAULT_EVERY_N_ITER",
    "BasicDataLoader",
    "CachePool",
    "SavableDataLoader",
    "SavableDataset",
    "WorkerConfig",
    "get_loader",
    "get_savable_loader",
    "warn_deprecated",
]
