"""The loader's public entry points check their arguments first: a bad one is an EnergonError
(ArgumentError, ArgumentTypeError, DatasetNotFoundError, StateError) whose message starts with the
argument's name, never a builtin error from deep inside (issue 33, point 4)."""

from __future__ import annotations

import numpy as np
import pytest

from energon import (
    ArgumentError,
    ArgumentTypeError,
    DatasetNotFoundError,
    EnergonError,
    StateError,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.errors import UnknownSplitError

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)
TRAIN = dict(worker_config=WC, batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=5)


@pytest.mark.parametrize(
    "change, error, argument",
    [
        (dict(worker_config="x"), ArgumentTypeError, "worker_config"),
        (dict(batch_size=0), ArgumentError, "batch_size"),
        (dict(batch_size=-1), ArgumentError, "batch_size"),
        (dict(batch_size="3"), ArgumentTypeError, "batch_size"),
        (dict(batch_size=2.5), ArgumentTypeError, "batch_size"),
        (dict(shuffle_buffer_size=-1), ArgumentError, "shuffle_buffer_size"),
        (dict(max_samples_per_sequence=0), ArgumentError, "max_samples_per_sequence"),
        (dict(num_streams=0), ArgumentError, "num_streams"),
        (dict(num_streams=-2), ArgumentError, "num_streams"),
        (dict(num_streams=500), ArgumentError, "num_streams"),  # more streams than samples
        (dict(parallel_shard_iters=0), ArgumentError, "parallel_shard_iters"),
        (dict(global_batch_size=0), ArgumentError, "global_batch_size"),
        (dict(shuffle_over_epochs_multiplier=0), ArgumentError, "shuffle_over_epochs_multiplier"),
        (dict(packing_buffer_size=3), ArgumentError, "packing_buffer_size"),
        (dict(split_part=3), ArgumentTypeError, "split_part"),
        (dict(task_encoder="x"), ArgumentTypeError, "task_encoder"),
        (dict(foo=1), ArgumentTypeError, "foo"),
    ],
)
def test_get_train_dataset_names_the_bad_argument(text_ds, change, error, argument):
    with pytest.raises(error) as raised:
        get_train_dataset(text_ds, **{**TRAIN, **change})
    assert raised.value.argument == argument
    assert str(raised.value).startswith(f"{argument}: ")


def test_a_numpy_integer_is_an_integer(text_ds):
    assert len(get_train_dataset(text_ds, **{**TRAIN, "batch_size": np.int64(3)}).spec.sources)


def test_paths_and_splits_that_do_not_exist(text_ds, tmp_path):
    with pytest.raises(DatasetNotFoundError, match=f"path: {tmp_path / 'nope'} does not exist"):
        get_train_dataset(tmp_path / "nope", **TRAIN)
    with pytest.raises(FileNotFoundError):  # still what callers catch
        get_val_dataset(tmp_path / "nope.yaml", worker_config=WC, batch_size=3)
    with pytest.raises(UnknownSplitError, match="'nosuch'"):
        get_val_dataset(text_ds, split_part="nosuch", worker_config=WC, batch_size=3)
    with pytest.raises(ArgumentError, match="^limit: "):
        get_val_dataset(text_ds, split_part="train", worker_config=WC, batch_size=3, limit=-1)


def test_loaders_and_restore(text_ds):
    for make in (get_loader, get_savable_loader):
        with pytest.raises(ArgumentTypeError, match="^dataset: "):
            make("not a dataset")
    dataset = get_train_dataset(text_ds, **TRAIN)
    other = WorkerConfig(rank=0, world_size=2, num_workers=0)
    with pytest.raises(ArgumentError, match="^worker_config: "):
        get_savable_loader(dataset, worker_config=other)
    loader = get_savable_loader(dataset)
    for bad, message in [
        ("state.json", "a loader state must be a dict, got str"),
        ({}, "not an energon loader state"),
        ({"format": "energon-loader-state", "version": 2}, "is missing"),
    ]:
        with pytest.raises(StateError, match=message):
            loader.restore_state_rank(bad)
    assert issubclass(StateError, EnergonError)
