"""Recycled batch memory must never overwrite data a user still holds."""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import pytest
import torch

from energon import WorkerConfig, get_loader, get_train_dataset
from energon.memory.buffer_pool import BufferPool

# A wait that outlives this ends the test with WatchdogTimeout instead of hanging it (a batch of
# the test set takes milliseconds).
STALL_SECONDS = 120


def _guarded_loader(dataset):
    return get_loader(
        dataset,
        watchdog_timeout_seconds=STALL_SECONDS,
        watchdog_initial_timeout_seconds=STALL_SECONDS,
        fail_on_timeout=True,
    )


def _small_batches(captioning_ds, num_workers: int, **dataset_options):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        captioning_ds,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=5,
        max_samples_per_sequence=5,
        **dataset_options,
    )
    return _guarded_loader(ds)


def _tight_arena(monkeypatch) -> None:
    """Arena blocks even for the test set's small batches, one batch per message, budget 0."""
    monkeypatch.setattr("energon.memory.batch_arena.MIN_BYTES", 1024)
    monkeypatch.setattr("energon.loader.workers.messages.GROUP_MAX_ITEMS", 0)
    monkeypatch.setenv("ENERGON_ARENA_MIB_PER_WORKER", "0")


def _record_imported_blocks(monkeypatch) -> list[int]:
    """The arena block of every batch tensor the main process receives, in order."""
    from energon.memory import batch_arena

    blocks: list[int] = []
    import_ref = batch_arena.BatchArena._import_ref

    def recording_import(self, ref):
        blocks.append(ref.block)
        return import_ref(self, ref)

    monkeypatch.setattr(batch_arena.BatchArena, "_import_ref", recording_import)
    return blocks


@contextlib.contextmanager
def _collections_scan_only_new_objects():
    """``gc.collect()`` inside looks only at objects made inside (``gc.freeze()`` the rest): a full
    collection costs ~0.1 s in a test process, and the batches it must find are all new."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(("num_workers", "arena_mib"), [(0, "256"), (2, "256"), (1, "0"), (2, "0")])
@_collections_scan_only_new_objects()
def test_kept_batches_and_views_stay_intact(captioning_ds, num_workers, arena_mib, monkeypatch):
    """Also with an arena budget of 0 (each worker keeps only the blocks the loop needs): a loop
    that keeps batches must not wait forever for a worker waiting for a block it holds."""
    monkeypatch.setattr("energon.memory.buffer_pool.MIN_BYTES", 1024)
    monkeypatch.setattr("energon.memory.batch_arena.MIN_BYTES", 1024)
    monkeypatch.setenv("ENERGON_ARENA_MIB_PER_WORKER", arena_mib)
    it = iter(_small_batches(captioning_ds, num_workers))
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


def test_workers_keep_only_the_blocks_their_budget_allows(captioning_ds, monkeypatch):
    """With a budget of 0 and a loop that drops each batch, every worker writes all its batches
    into one block: a worker whose block is still in use waits for the main process to free it
    instead of opening another one (torch's prefetch would otherwise keep three per worker)."""
    from energon.memory import batch_arena

    _tight_arena(monkeypatch)
    blocks = _record_imported_blocks(monkeypatch)
    images = []
    for i, batch in enumerate(_small_batches(captioning_ds, 2)):
        images.append(batch.image.clone())
        if i == 29:
            break
    assert len(blocks) == 30
    assert set(blocks) == {0, batch_arena.BLOCKS_PER_WORKER}
    # the same batches as without a budget
    monkeypatch.setenv("ENERGON_ARENA_MIB_PER_WORKER", "256")
    for i, batch in enumerate(_small_batches(captioning_ds, 2)):
        assert torch.equal(batch.image, images[i])
        if i == 29:
            break


def test_workers_waiting_for_a_block_end_when_the_loader_is_dropped(captioning_ds, monkeypatch):
    """The loop holds every batch and the workers wait for blocks; dropping the loader must let
    them end on their own, not leave the pool to kill them after its join timeout."""
    import multiprocessing.process

    _tight_arena(monkeypatch)
    killed = []
    kill = multiprocessing.process.BaseProcess.kill

    def recording_kill(process):
        killed.append(process.pid)
        kill(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "kill", recording_kill)
    # the pool's wait for its workers to end, with a wide margin for a busy machine (a worker
    # that ends on its own takes well under a second; one that waits for a block never ends)
    monkeypatch.setattr("energon.loader.workers.processes.STOP_SECONDS", 60.0)
    loader = _small_batches(captioning_ds, 2)
    it = iter(loader)
    kept = [next(it) for _ in range(4)]
    workers = [proc.process for proc in loader._transport.source.pool._procs]
    assert len(workers) == 2
    del it, loader
    gc.collect()
    assert not any(worker.is_alive() for worker in workers)
    assert killed == [], "the pool had to kill workers that waited for a block"
    assert len(kept) == 4


def test_arena_budget_must_be_a_number(captioning_ds, monkeypatch):
    monkeypatch.setenv("ENERGON_ARENA_MIB_PER_WORKER", "lots")
    with pytest.raises(ValueError, match="ENERGON_ARENA_MIB_PER_WORKER.*'lots'"):
        next(iter(_small_batches(captioning_ds, 1)))


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
            live = pool.live_bytes
            held.pop(0)
            # back in the pool with its last reference (no gc.collect() needed: at ~0.1 s per
            # call in a test process it was most of this test's time)
            assert pool.live_bytes < live
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


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_a_finite_pass_that_keeps_its_batches_ends(captioning_ds, num_workers, monkeypatch):
    """A validation pass whose loop keeps every batch, with a budget of 0: when a worker's data
    ends, torch moves past it inside one wait of the main process; the other workers must then
    not wait for blocks that only the loop could free."""
    from energon import get_val_dataset

    _tight_arena(monkeypatch)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_val_dataset(captioning_ds, worker_config=wc, batch_size=4, split_part="train")
    loader = _guarded_loader(ds)
    kept = list(loader)
    keys = [key for batch in kept for key in batch.__key__]
    assert len(keys) == len(set(keys)) == 60  # every sample of the set, once
    copies = [batch.image.clone() for batch in kept]
    again = list(loader)  # the next pass reuses blocks: the kept batches must not change
    assert len(again) == len(kept)
    assert all(torch.equal(batch.image, copy) for batch, copy in zip(kept, copies))


def test_a_batch_with_two_large_tensors_is_never_held_back(captioning_ds, tmp_path, monkeypatch):
    """A batch with two large tensors takes a block for each, also under a budget of 0: the
    budget holds back only what earlier batches keep (no block is ever taken past the budget,
    which would mean the worker waited for the main process to ask for its batch)."""
    from energon import DefaultTaskEncoder
    from energon.memory import batch_arena
    from energon.samples.collate import batch_pad_stack

    class TwoImages(DefaultTaskEncoder):
        def batch(self, samples):
            images = [sample.image for sample in samples]
            return {"a": batch_pad_stack(images), "b": batch_pad_stack(images)}

    _tight_arena(monkeypatch)
    past_budget = tmp_path / "past_budget"
    exceed_budget = batch_arena.BatchArena._exceed_budget

    def recording_exceed(self, slot, nbytes):
        with open(past_budget, "a") as f:  # runs in the workers: record in a file
            f.write(f"{self.worker}\n")
        return exceed_budget(self, slot, nbytes)

    monkeypatch.setattr(batch_arena.BatchArena, "_exceed_budget", recording_exceed)
    blocks = _record_imported_blocks(monkeypatch)
    for i, batch in enumerate(_small_batches(captioning_ds, 2, task_encoder=TwoImages())):
        assert torch.equal(batch["a"], batch["b"])
        if i == 19:
            break
    assert len(blocks) == 40
    per_worker = batch_arena.BLOCKS_PER_WORKER
    assert set(blocks) == {0, 1, per_worker, per_worker + 1}
    assert not past_budget.exists(), past_budget.read_text()
