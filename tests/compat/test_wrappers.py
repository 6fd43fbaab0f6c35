"""Composed wrapper chains on energon: exact save/restore (with and without workers), restore on
another number of ranks, restore_sample, and clear errors where a composition cannot keep energon's
guarantees."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from energon import (
    BatchDataset,
    BlendDataset,
    EpochizeDataset,
    FilterDataset,
    GroupBatchDataset,
    IterMapDataset,
    LimitDataset,
    MapDataset,
    PackingDataset,
    RepeatDataset,
    ShuffleBufferDataset,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    stateless,
)
from energon.compat.dataset_config import get_dataset_from_config
from tests.helpers.datasets import make_text_dataset


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("wrappers")
    a = make_text_dataset(root / "a", num_samples=45, num_shards=3)
    b = make_text_dataset(root / "b", num_samples=30, num_shards=2, seed=1)
    return a, b


@stateless
def upper(sample):
    return sample.text.upper()


@stateless
def keys_of(samples):
    return [s if isinstance(s, str) else s.__key__ for s in samples]


def pairs(it):
    it = iter(it)
    for x in it:
        y = next(it, None)
        yield (x, y)


def pair_keys(samples):
    return [(p[0].__key__, p[1].__key__ if p[1] is not None else None) for p in samples]


def build_chain(paths, wc: WorkerConfig):
    """Factories -> Map -> Repeat -> Blend -> ShuffleBuffer -> Batch -> Epochize."""
    a, b = (get_dataset_from_config(p, training=True, worker_config=wc) for p in paths)
    da = RepeatDataset(
        MapDataset(a.build(), upper, stateless_map_fn=True, worker_config=wc), worker_config=wc
    )
    db = RepeatDataset(
        FilterDataset(b.build(), filter_fn=lambda s: True, worker_config=wc), worker_config=wc
    )
    blend = BlendDataset((da, 1.0), (db, 2.0), worker_config=wc)
    shuffled = ShuffleBufferDataset(blend, 7, worker_config=wc)
    batched = BatchDataset(shuffled, 3, keys_of, batcher_stateless=True, worker_config=wc)
    return EpochizeDataset(batched, 25, worker_config=wc)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_composed_chain_restores_exactly(two_datasets, num_workers):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    loader = get_savable_loader(build_chain(two_datasets, wc))
    assert len(loader) == 25
    it = iter(loader)
    for _ in range(11):
        next(it)
    state = loader.save_state_rank()
    expected = [next(it) for _ in range(9)]
    resumed = get_savable_loader(build_chain(two_datasets, wc))
    resumed.restore_state_rank(state)
    assert [next(iter(resumed)) for _ in range(1)] + [
        b for b, _ in zip(iter(resumed), range(8))
    ] == expected
    assert all(len(batch) == 3 for batch in expected)


def test_composed_chain_is_independent_of_worker_count(two_datasets):
    """The order depends on the logical streams (the state keeps their number), not on how many
    workers execute them."""
    two = WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = get_savable_loader(build_chain(two_datasets, two))
    it = iter(loader)
    for _ in range(6):
        next(it)
    state = loader.save_state_rank()
    expected = [next(it) for _ in range(6)]
    one = WorkerConfig(rank=0, world_size=1, num_workers=0)
    resumed = get_savable_loader(build_chain(two_datasets, one))
    resumed.restore_state_rank(state)
    it2 = iter(resumed)
    assert [next(it2) for _ in range(6)] == expected


def test_composed_chain_restores_on_another_number_of_ranks(two_datasets):
    ranks = [WorkerConfig(rank=r, world_size=2, num_workers=0) for r in range(2)]
    loaders = [get_savable_loader(build_chain(two_datasets, wc)) for wc in ranks]
    iters = [iter(lo) for lo in loaders]
    for _ in range(4):
        for it in iters:
            next(it)
    states = [lo.save_state_rank() for lo in loaders]
    global_next = [batch for _ in range(5) for batch in (next(iters[0]), next(iters[1]))]
    single = get_savable_loader(
        build_chain(two_datasets, WorkerConfig(rank=0, world_size=1, num_workers=0))
    )
    single.restore_state_global(states)
    it = iter(single)
    assert [next(it) for _ in range(10)] == global_next


def test_restore_sample_of_a_composed_batch(two_datasets):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    a = get_dataset_from_config(two_datasets[0], training=False, worker_config=wc)
    ds = BatchDataset(
        MapDataset(a.build(), upper, stateless_map_fn=True, worker_config=wc),
        4,
        lambda xs: {"__restore_key__": (), "texts": xs},
        batcher_stateless=True,
        worker_config=wc,
    )
    loader = get_savable_loader(ds)
    assert loader.can_restore_sample()
    batches = list(loader)
    assert [len(b["texts"]) for b in batches] == [4] * 11 + [1]
    for batch in (batches[0], batches[5], batches[-1]):
        assert batch["__restore_key__"][0] == "Stream"
        assert loader.restore_sample(batch["__restore_key__"])["texts"] == batch["texts"]
    not_stateless = MapDataset(a.build(), lambda s: s, worker_config=wc)
    assert not get_savable_loader(not_stateless).can_restore_sample()


def test_buffers_restore_mid_buffer(two_datasets):
    """Group buckets, packing buffers and iter-map pending inputs are saved as restore keys."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def chain():
        a = get_dataset_from_config(two_datasets[0], training=False, worker_config=wc)
        grouped = GroupBatchDataset(
            a.build(), None, lambda s: (len(s.text) % 3, 2), keys_of, worker_config=wc
        )
        b = get_dataset_from_config(two_datasets[1], training=False, worker_config=wc)
        packed = PackingDataset(
            b.build(), 5, lambda xs: [xs[:3], xs[3:]], keys_of, worker_config=wc
        )
        paired = IterMapDataset(
            get_dataset_from_config(two_datasets[1], training=False, worker_config=wc).build(),
            pairs,
            len_map_fn=lambda n: (n + 1) // 2,
            worker_config=wc,
        )
        return [grouped, packed, BatchDataset(paired, 2, pair_keys, worker_config=wc)]

    for index in range(3):
        loader = get_savable_loader(chain()[index])
        it = iter(loader)
        first = [next(it) for _ in range(3)]
        state = loader.save_state_rank()
        rest = list(it)
        resumed = get_savable_loader(chain()[index])
        resumed.restore_state_rank(state)
        assert list(resumed) == rest
        assert first and rest


def test_blend_attributes_and_weights(two_datasets):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    train = [
        get_train_dataset(
            p,
            batch_size=None,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=wc,
        )
        for p in two_datasets
    ]
    blend = BlendDataset((train[0], 1), (train[1], 3), worker_config=wc)
    assert isinstance(blend, BlendDataset)
    assert [w for _, w in blend.dataset_weights] == [1, 3]
    assert blend.dataset_weights[0][0] is train[0]
    assert blend.config()["type"] == "BlendDataset"


def test_epoch_and_limit_must_be_outermost(two_datasets):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    a = get_dataset_from_config(two_datasets[0], training=True, worker_config=wc)
    epoch = EpochizeDataset(RepeatDataset(a.build(), worker_config=wc), 5, worker_config=wc)
    with pytest.raises(ValueError, match="must be the outermost wrapper"):
        MapDataset(epoch, upper, worker_config=wc)
    limited = LimitDataset(a.build(), 3, worker_config=wc)
    with pytest.raises(ValueError, match="LimitDataset must be the outermost"):
        BatchDataset(limited, 2, keys_of, worker_config=wc)


def test_clear_errors_for_what_cannot_be_composed(two_datasets):
    import torch.utils.data

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(TypeError, match="wraps datasets from get_train_dataset"):
        MapDataset([1, 2, 3], upper, worker_config=wc)  # a list is a list of datasets

    class Custom(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield 1

    with pytest.raises(TypeError, match="not Custom"):
        MapDataset(Custom(), upper, worker_config=wc)
    other = WorkerConfig(rank=0, world_size=1, num_workers=3)
    a = get_dataset_from_config(two_datasets[0], training=False, worker_config=other)
    with pytest.raises(ValueError, match="another worker config"):
        MapDataset(a.build(), upper, worker_config=wc)
    with pytest.raises(TypeError):
        LimitDataset(a.build(), 3, worker_config=other, reset_after_epohc=True)
    inner = get_train_dataset(
        two_datasets[0],
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        virtual_epoch_length=10,
        worker_config=wc,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MapDataset(inner, upper, worker_config=wc)
    assert any("virtual_epoch_length" in str(w.message) for w in caught)


def test_iterating_a_dataset_without_a_loader(two_datasets):
    """``for item in dataset`` yields what a loader without workers yields (plain items)."""
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    a = get_dataset_from_config(two_datasets[0], training=False, worker_config=wc)
    composed = BatchDataset(a.build(), 4, keys_of, worker_config=wc)
    assert list(composed) == list(get_savable_loader(composed))
    train = get_train_dataset(
        two_datasets[1],
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        virtual_epoch_length=6,
        worker_config=wc,
    )
    direct = list(train)
    assert len(direct) == 6 and [b.__key__ for b in direct] == [
        b.__key__ for b in list(get_savable_loader(train))
    ]
