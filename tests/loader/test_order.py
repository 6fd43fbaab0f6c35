"""The data order is defined by logical streams: same config + seed => same global sequence of
micro-batches, whatever the number of ranks and worker processes executing it."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from energon import WorkerConfig, get_loader, get_train_dataset


def rank_batches(path, *, rank, world_size, num_workers, num_batches, **kwargs):
    wc = WorkerConfig(
        rank=rank, world_size=world_size, num_workers=num_workers, seed_offset=kwargs.pop("seed", 0)
    )
    options = dict(batch_size=3, shuffle_buffer_size=5, max_samples_per_sequence=4)
    options.update(kwargs)
    ds = get_train_dataset(path, worker_config=wc, **options)
    it = iter(get_loader(ds))
    return [tuple(next(it).__key__) for _ in range(num_batches)]


def global_sequence(path, *, world_size, num_workers, num_batches, **kwargs):
    """Interleave the ranks' micro-batches into the global order (rank r takes r, r+R, ...)."""
    per_rank = [
        rank_batches(
            path,
            rank=r,
            world_size=world_size,
            num_workers=num_workers,
            num_batches=num_batches,
            **kwargs,
        )
        for r in range(world_size)
    ]
    return [per_rank[r][k] for k in range(num_batches) for r in range(world_size)]


def test_global_order_is_independent_of_ranks_and_workers(text_ds):
    reference = global_sequence(text_ds, world_size=1, num_workers=0, num_batches=24, num_streams=4)
    for world_size, num_workers in [(1, 4), (2, 2), (4, 1), (2, 0), (1, 2)]:
        seq = global_sequence(
            text_ds,
            world_size=world_size,
            num_workers=num_workers,
            num_batches=24 // world_size,
            num_streams=4,
        )
        assert seq == reference, (world_size, num_workers)


def test_default_stream_count_is_ranks_times_workers(text_ds):
    a = global_sequence(text_ds, world_size=2, num_workers=2, num_batches=6)
    b = global_sequence(text_ds, world_size=1, num_workers=4, num_batches=12)
    assert a == b


def test_each_epoch_delivers_every_sample_exactly_once(text_ds):
    # 120 samples over 4 streams = 30 per stream = 10 batches of 3: the first 40 global batches are
    # exactly one epoch (no shuffle buffer, so nothing of the next epoch leaks in).
    seq = global_sequence(
        text_ds,
        world_size=2,
        num_workers=2,
        num_batches=40,
        shuffle_buffer_size=None,
    )
    epoch1 = [k for batch in seq[:40] for k in batch]
    epoch2 = [k for batch in seq[40:80] for k in batch]
    assert len(epoch1) == 120 and len(set(epoch1)) == 120
    assert Counter(epoch2) == Counter(epoch1)
    assert epoch1 != epoch2, "training data must be reshuffled every epoch"


def test_ranks_and_workers_read_disjoint_samples(text_ds):
    seen = []
    for rank in range(2):
        batches = rank_batches(
            text_ds,
            rank=rank,
            world_size=2,
            num_workers=2,
            num_batches=20,
            shuffle_buffer_size=None,
        )
        seen.append({k for b in batches for k in b})
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 120


def test_deterministic_across_runs_and_global_rngs(text_ds):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    a = global_sequence(text_ds, world_size=1, num_workers=2, num_batches=10)
    random.seed(2)
    np.random.seed(2)
    torch.manual_seed(2)
    b = global_sequence(text_ds, world_size=1, num_workers=2, num_batches=10)
    assert a == b


def test_loading_does_not_touch_global_rngs(text_ds):
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    global_sequence(text_ds, world_size=1, num_workers=2, num_batches=5)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0])
    assert np.array_equal(expected[1], got[1])
    assert expected[2] == got[2]


def test_seed_offset_changes_order(text_ds):
    a = global_sequence(text_ds, world_size=1, num_workers=0, num_batches=10, num_streams=2)
    b = global_sequence(text_ds, world_size=1, num_workers=0, num_batches=10, num_streams=2, seed=7)
    assert a != b
    flat_a = Counter(k for batch in a for k in batch)
    assert sum(flat_a.values()) == 30


def test_virtual_epoch_length_and_continuation(text_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        text_ds,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        virtual_epoch_length=7,
    )
    loader = get_loader(ds)
    assert len(loader) == 7
    first = [tuple(b.__key__) for b in loader]
    second = [tuple(b.__key__) for b in loader]
    assert len(first) == len(second) == 7
    assert not set(first) & set(second), "the second pass continues the stream"
    fresh = get_loader(
        get_train_dataset(
            text_ds,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
        )
    )
    it = iter(fresh)
    assert [tuple(next(it).__key__) for _ in range(14)] == first + second


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_pad_stacked_images(captioning_ds, num_workers):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        captioning_ds,
        worker_config=wc,
        batch_size=4,
        shuffle_buffer_size=10,
        max_samples_per_sequence=10,
    )
    batch = next(iter(get_loader(ds)))
    assert batch.image.dtype == torch.float32 and batch.image.ndim == 4
    assert batch.image.shape[:2] == (4, 3)
    assert 0.0 <= float(batch.image.min()) and float(batch.image.max()) <= 1.0
    assert len(batch.caption) == 4 and all(isinstance(c, str) for c in batch.caption)
    assert batch["image"] is batch.image
