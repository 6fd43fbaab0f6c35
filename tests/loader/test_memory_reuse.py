"""Recycled batch memory must never overwrite data a user still holds."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.memory.buffer_pool import BufferPool


@pytest.mark.parametrize("num_workers", [0, 2])
def test_kept_batches_and_views_stay_intact(captioning_ds, num_workers, monkeypatch):
    monkeypatch.setattr("energon.memory.buffer_pool.MIN_BYTES", 1024)
    monkeypatch.setattr("energon.memory.batch_arena.MIN_BYTES", 1024)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        captioning_ds,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
    )
    it = iter(get_loader(ds))
    kept, kept_sums = [], []
    views, view_sums = [], []
    for i in range(30):
        batch = next(it)
        if i % 3 == 0:
            kept.append(batch)
            kept_sums.append(batch.image.clone())
        else:
            view = batch.image[1]  # keep a view only; the batch itself is dropped
            views.append(view)
            view_sums.append(view.clone())
        del batch
        gc.collect()
    for _ in range(20):
        next(it)
    gc.collect()
    for batch, expected in zip(kept, kept_sums):
        assert torch.equal(batch.image, expected)
    for view, expected in zip(views, view_sums):
        assert torch.equal(view, expected)


def test_pool_reuses_freed_buffers_and_respects_its_bound():
    pool = BufferPool(max_bytes=8 << 20)
    a = pool.empty((1 << 20,), np.uint8)
    address = a.ctypes.data
    del a
    gc.collect()
    b = pool.empty((1 << 20,), np.uint8)
    assert b.ctypes.data == address, "a freed buffer of the same size is reused"
    c = pool.empty((1 << 22,), np.float32)  # 16 MiB: over the bound
    assert c is None
    assert pool.empty((100,), np.uint8) is None, "small arrays are not pooled"
    held = torch.from_numpy(b)
    del b
    gc.collect()
    d = pool.empty((1 << 20,), np.uint8)
    assert d.ctypes.data != held.data_ptr(), "a buffer still viewed by a tensor is not handed out"
