"""Workers send their items to the main process in groups (one message per group, see
``energon.loader.workers.messages.grouped``); the loader hands them out exactly as with one item per
message: the same batches in the same order, validation passes whose workers end at different
times, and an error of a worker's pipeline at the very step where it happened."""

from __future__ import annotations

import pytest

import energon.loader.workers.messages as messages
from energon import (
    DefaultTaskEncoder,
    FatalSampleError,
    WorkerConfig,
    get_loader,
    get_train_dataset,
    get_val_dataset,
)

# (seconds a worker gathers items for, most items per group): one item per message is how the
# loader behaved before groups; the others force groups of a fixed size whatever the machine's speed
ONE_PER_MESSAGE = (0.0, 8)
GROUPINGS = [(3600.0, 8), (3600.0, 3)]


def set_grouping(monkeypatch, grouping):
    seconds, items = grouping
    monkeypatch.setattr(messages, "GROUP_SECONDS", seconds)
    monkeypatch.setattr(messages, "GROUP_MAX_ITEMS", items)


def train_keys(path, num_workers, batches=30):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=3,
        shuffle_buffer_size=5,
        max_samples_per_sequence=4,
        num_streams=6,
    )
    it = iter(get_loader(ds))
    return [tuple(next(it).__key__) for _ in range(batches)]


def val_keys(path, num_workers, world_size, rank):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    loader = get_loader(get_val_dataset(path, worker_config=wc, batch_size=4, even_ranks=False))
    return [tuple(b.__key__) for b in loader]


class FailOnKey(DefaultTaskEncoder):
    """A programming error on one sample (None: on none): fatal, never skipped."""

    def __init__(self, key: str | None) -> None:
        super().__init__()
        self.key = key

    def encode_sample(self, sample):
        if sample.__key__ == self.key:
            raise FatalSampleError(f"broken on purpose: {self.key}")
        return sample


def failing_loader(path, num_workers, key):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    ds = get_train_dataset(
        path,
        worker_config=wc,
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        num_streams=6,
        task_encoder=FailOnKey(key),
    )
    return get_loader(ds)


def keys_until_error(path, num_workers, key):
    keys = []
    with pytest.raises(FatalSampleError, match="broken on purpose"):
        for batch in failing_loader(path, num_workers, key):
            keys.append(tuple(batch.__key__))
    return keys


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("num_workers", [2, 3])
def test_groups_give_the_order_of_one_item_per_message(text_ds, monkeypatch, grouping, num_workers):
    set_grouping(monkeypatch, ONE_PER_MESSAGE)
    reference = train_keys(text_ds, num_workers)
    assert reference == train_keys(text_ds, 0)  # fixed streams: the plan's order
    set_grouping(monkeypatch, grouping)
    assert train_keys(text_ds, num_workers) == reference


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_validation_workers_that_end_at_different_times(text_val_ds, monkeypatch, grouping):
    """40 samples in batches of 4 over 3 ranks x 2 workers: the workers' streams end after
    different numbers of batches."""
    set_grouping(monkeypatch, ONE_PER_MESSAGE)
    reference = [val_keys(text_val_ds, 2, 3, rank) for rank in range(3)]
    set_grouping(monkeypatch, grouping)
    grouped = [val_keys(text_val_ds, 2, 3, rank) for rank in range(3)]
    assert grouped == reference
    assert sorted(k for rank in grouped for batch in rank for k in batch) == sorted(
        k for rank in reference for batch in rank for k in batch
    )
    assert sum(len(batch) for rank in grouped for batch in rank) == 40


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_an_error_in_a_worker_surfaces_at_its_step(text_ds, monkeypatch, grouping):
    """The sample of the plan's 10th batch fails: with groups, its worker made batches before it
    in the same group and the other workers made later batches; exactly the 9 batches before it
    are delivered, as without workers."""
    it = iter(failing_loader(text_ds, 0, None))
    plan = [tuple(next(it).__key__) for _ in range(12)]
    key = plan[9][0]
    assert keys_until_error(text_ds, 0, key) == plan[:9]
    set_grouping(monkeypatch, grouping)
    for num_workers in (2, 3):
        assert keys_until_error(text_ds, num_workers, key) == plan[:9], num_workers
