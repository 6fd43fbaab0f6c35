"""``megatron.energon.savable_loader``: the loaders (energon's :mod:`energon.loader.data_loader`)
and the reference's state records. energon's loader states are plain dicts (docs/save-restore.md);
``SavableDataLoaderState`` and the checkpoint records are the reference's shapes, for code that
builds or inspects such records itself. ``SavableDatasetWrapper`` / ``SimpleSavableDatasetWrapper``
(the reference's per-worker wrappers) have no counterpart: energon's loader runs logical streams."""

from __future__ import annotations

from typing import Any

from energon.compat.cache import CachePool
from energon.compat.deprecation import deprecated
from energon.compat.flavors import State
from energon.compat.rng import SystemRng, SystemRngState
from energon.compat.savable import FlexState
from energon.compat.wrappers.base import BaseWrapperDataset, add_sample_restore_key
from energon.compat.wrappers.batch_dataset import BatchDataset
from energon.compat.wrappers.gc_dataset import GC_DEFAULT_EVERY_N_ITER, GcDataset, gc_init_worker
from energon.compat.wrappers.watchdog_dataset import WatchdogDataset
from energon.loader.data_loader import BasicDataLoader, SavableDataLoader
from energon.loader.savable_dataset import SavableDataset
from energon.sample_text import default_get_batch_keys
from energon.samples.edataclass import edataclass
from energon.worker import WorkerConfig

__all__ = [
    "GC_DEFAULT_EVERY_N_ITER",
    "BaseWrapperDataset",
    "BasicDataLoader",
    "BatchDataset",
    "CachePool",
    "FlexState",
    "GcDataset",
    "SavableCheckpoint",
    "SavableDataLoader",
    "SavableDataLoaderState",
    "SavableDataset",
    "SavableDatasetCheckpoint",
    "SavableDatasetState",
    "State",
    "SystemRng",
    "SystemRngState",
    "WatchdogDataset",
    "WorkerConfig",
    "add_sample_restore_key",
    "default_get_batch_keys",
    "deprecated",
    "edataclass",
    "gc_init_worker",
]


@edataclass
class SavableDatasetState(State):
    """A worker's dataset state: its RNG state, the dataset's own state and sample index."""

    rng: SystemRngState
    dataset_state: FlexState
    sample_index: int


@edataclass
class SavableCheckpoint:
    """A worker checkpoint taken at ``checkpoint_time`` after ``sample_index`` samples."""

    state: Any
    checkpoint_time: float
    sample_index: int


@edataclass
class SavableDatasetCheckpoint(State):
    """A worker state and how many samples after it the worker had produced."""

    state: Any
    offset: int


@edataclass
class SavableDataLoaderState(State):
    """A loader's state: one entry per worker, the next worker to read from, the batch size."""

    worker_states: list[SavableDatasetCheckpoint | FlexState]
    next_worker_id: int
    micro_batch_size: int | None
