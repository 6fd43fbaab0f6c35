"""A process that builds datasets again and again (a validation set per evaluation, a notebook)
keeps its open files flat: what a dataset opens (the shard table, the sample index database) goes
with the dataset, not into a process-wide cache that outlives it."""

from __future__ import annotations

import gc
import os
import pickle

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.source.meta import meta_reader
from energon.source.webdataset import WebdatasetLeaf

BUILDS = 12


def _open_files() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def _build_and_read(path) -> None:
    ds = get_train_dataset(
        str(path),
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    batches = iter(get_loader(ds))
    next(batches)
    next(batches)
    leaf = WebdatasetLeaf.open(path, split_part="train")
    assert meta_reader(leaf).key(1) is not None  # opens index.sqlite


def test_building_datasets_again_and_again_keeps_open_files_flat(captioning_ds):
    _build_and_read(captioning_ds)  # the process-wide shard reader opens its files once
    before = _open_files()
    for _ in range(BUILDS):
        _build_and_read(captioning_ds)
    assert _open_files() == before


def test_a_leafs_reader_is_its_own_and_pickles_empty(captioning_ds):
    leaf = WebdatasetLeaf.open(captioning_ds, split_part="train")
    reader = meta_reader(leaf)
    assert meta_reader(leaf) is reader  # one per leaf and process
    key = reader.key(0)
    copy = pickle.loads(pickle.dumps(leaf))  # what a spawned worker gets: no open connection
    assert meta_reader(copy) is not reader and meta_reader(copy).key(0) == key
    other = WebdatasetLeaf.open(captioning_ds, split_part="train")
    assert meta_reader(other) is not reader
