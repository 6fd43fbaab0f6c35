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


def test_pool_holds_at_most_one_and_a_half_times_its_peak_use():
    """Batches of slightly varying shape, up to three alive at a time: the pool keeps about what
    that needs, not its byte cap."""
    pool = BufferPool(max_bytes=1 << 30)
    rng = np.random.default_rng(0)
    held = []
    for _ in range(200):
        size = int(rng.integers(14 << 20, 16 << 20))  # 14-16 MiB "batches"
        held.append(pool.empty((size,), np.uint8))
        if len(held) > 2:
            held.pop(0)
        gc.collect()
        assert pool.owned_bytes <= 1.5 * pool.peak_live_bytes
    assert pool.peak_live_bytes <= 3 * (16 << 20)  # three buffers of the largest size class
    assert pool.owned_bytes <= 4 * (16 << 20)


def test_pool_buffers_are_private_to_a_forked_worker():
    """A worker forked while the parent holds pooled memory gets a copy, as with heap memory."""
    import multiprocessing

    pool = BufferPool(max_bytes=64 << 20)
    array = pool.empty((1 << 20,), np.uint8)
    array[:] = 1

    def overwrite() -> None:
        array[:] = 2

    child = multiprocessing.get_context("fork").Process(target=overwrite)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert (array == 1).all()
