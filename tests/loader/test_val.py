"""Validation: one deterministic pass, every sample once, the same batches every pass, and the same
number of batches on every rank (balanced; padded only when it cannot be avoided)."""

from __future__ import annotations

from collections import Counter

import pytest

from energon import WorkerConfig, get_loader, get_val_dataset, get_val_datasets


def val_pass(path, *, rank, world_size, num_workers, batch_size, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    loader = get_loader(get_val_dataset(path, worker_config=wc, batch_size=batch_size, **kwargs))
    return loader, [list(b.__key__) if batch_size else [b.__key__] for b in loader]


@pytest.mark.parametrize(
    "world_size,num_workers,batch_size",
    [(1, 0, 11), (1, 2, 11), (2, 2, 11), (3, 1, 7), (2, 0, 10), (4, 1, 1), (3, 2, 4), (2, 2, None)],
)
def test_every_sample_once_and_ranks_even(text_val_ds, world_size, num_workers, batch_size):
    counts = Counter()
    lengths = []
    for rank in range(world_size):
        loader, batches = val_pass(
            text_val_ds,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=batch_size,
        )
        assert len(batches) == len(loader)
        assert all(batches), "no empty batches"
        if batch_size:
            assert all(len(b) <= batch_size for b in batches)
        lengths.append(len(batches))
        counts.update(k for b in batches for k in b)
    assert len(set(lengths)) == 1, f"uneven ranks: {lengths}"
    assert len(counts) == 40, "every val sample is seen"
    padded = sum(counts.values()) - 40
    streams = world_size * max(1, num_workers)
    assert padded < streams, "padding only fills the few streams that are one sample short"
    if batch_size and batch_size > 1:
        assert padded == 0, "with batches > 1 sample, balancing avoids any repetition"


@pytest.mark.parametrize("world_size,num_workers,batch_size", [(4, 1, 1), (3, 2, 4), (2, 2, 11)])
def test_uneven_ranks_on_request(text_val_ds, world_size, num_workers, batch_size):
    """even_ranks=False (Megatron-Energon's behaviour): natural full batches, nothing repeated,
    ranks may differ in length."""
    counts = Counter()
    for rank in range(world_size):
        loader, batches = val_pass(
            text_val_ds,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=batch_size,
            even_ranks=False,
        )
        assert len(batches) == len(loader)
        partial = [b for b in batches if len(b) < batch_size]
        assert len(partial) <= max(1, num_workers)  # at most each stream's last batch
        counts.update(k for b in batches for k in b)
    assert sorted(counts.values()) == [1] * 40


def test_same_batches_every_pass_and_no_shuffle(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = get_loader(get_val_dataset(text_val_ds, worker_config=wc, batch_size=8))
    first = [list(b.__key__) for b in loader]
    second = [list(b.__key__) for b in loader]
    assert first == second
    wc0 = WorkerConfig(rank=0, world_size=1, num_workers=0)
    single = get_loader(
        get_val_dataset(text_val_ds, worker_config=wc0, batch_size=8, num_streams=2)
    )
    assert [list(b.__key__) for b in single] == first
    # one stream reads its range in order
    one = get_loader(get_val_dataset(text_val_ds, worker_config=wc0, batch_size=40))
    keys = next(iter(one)).__key__
    assert keys == sorted(keys)


def test_limit_repeats_the_first_batches(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = get_loader(get_val_dataset(text_val_ds, worker_config=wc, batch_size=3, limit=4))
    assert len(loader) == 4
    first = [list(b.__key__) for b in loader]
    second = [list(b.__key__) for b in loader]
    assert len(first) == 4 and first == second


def test_drop_last_keeps_ranks_even(text_val_ds):
    lengths = []
    for rank in range(3):
        loader, batches = val_pass(
            text_val_ds, rank=rank, world_size=3, num_workers=0, batch_size=4, batch_drop_last=True
        )
        assert all(len(b) == 4 for b in batches)
        lengths.append(len(batches))
    assert len(set(lengths)) == 1


def test_get_val_datasets_returns_one_pipeline_per_dataset(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    pairs = get_val_datasets(text_val_ds, worker_config=wc, batch_size=5)
    assert len(pairs) == 1
    dataset, leaf = pairs[0]
    assert len(leaf) == 40
    assert sum(len(b.__key__) for b in get_loader(dataset)) == 40
