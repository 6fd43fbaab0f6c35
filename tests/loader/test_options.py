"""The entry points take every option as a named, typed keyword (issue 34, point 4): what
``get_train_dataset`` accepts can be read from its signature and docstring, a misspelt keyword
fails at the call naming the closest valid one, and the reference's keywords keep working."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from energon import (
    ArgumentTypeError,
    ErrorBudget,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    get_val_datasets,
)
from energon.loader.build import DatasetOptions

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)
TRAIN = dict(worker_config=WC, batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=5)
DATASET_FUNCTIONS = (get_train_dataset, get_val_dataset, get_val_datasets)


def _keywords(function) -> list[inspect.Parameter]:
    return [
        p
        for p in inspect.signature(function).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


@pytest.mark.parametrize("function", DATASET_FUNCTIONS + (get_savable_loader, get_loader))
def test_every_option_is_a_typed_keyword(function):
    keywords = _keywords(function)
    assert len(keywords) >= 6
    assert [p.name for p in keywords if p.annotation is inspect.Parameter.empty] == []


def test_every_option_of_energon_is_documented():
    """The keywords after the reference's (``repeat``) are DatasetOptions' fields, each explained
    in its docstring, which the functions' docstrings point to."""
    names = [p.name for p in _keywords(get_train_dataset)]
    own = names[names.index("repeat") + 1 :]
    assert own == [field.name for field in dataclasses.fields(DatasetOptions)]
    assert [name for name in own if f"``{name}``" not in DatasetOptions.__doc__] == []
    assert "DatasetOptions" in get_train_dataset.__doc__


def test_validation_takes_the_options_of_training_but_the_shuffling_ones():
    shuffling = {
        "shuffle_buffer_size",
        "max_samples_per_sequence",
        "virtual_epoch_length",
        "shuffle_over_epochs_multiplier",
        "repeat",
    }
    train = {p.name for p in _keywords(get_train_dataset)}
    for function in (get_val_dataset, get_val_datasets):
        assert {p.name for p in _keywords(function)} == train - shuffling | {"limit"}


@pytest.mark.parametrize(
    "function, call, typo, closest",
    [
        (get_train_dataset, TRAIN, "shuffle_buffer", "shuffle_buffer_size"),
        (get_train_dataset, TRAIN, "num_stream", "num_streams"),
        (get_train_dataset, TRAIN, "balanse", "balance"),
        (get_val_dataset, dict(worker_config=WC, batch_size=3), "limits", "limit"),
        (get_val_datasets, dict(worker_config=WC, batch_size=3), "even_rank", "even_ranks"),
    ],
)
def test_a_misspelt_keyword_names_the_closest(text_ds, function, call, typo, closest):
    with pytest.raises(ArgumentTypeError) as raised:
        function(text_ds, **call, **{typo: 1})
    assert raised.value.argument == typo
    assert f"did you mean {closest!r}?" in str(raised.value)


@pytest.mark.parametrize("function", (get_savable_loader, get_loader))
def test_a_misspelt_loader_keyword_names_the_closest(text_ds, function):
    dataset = get_train_dataset(text_ds, **TRAIN)
    with pytest.raises(ArgumentTypeError) as raised:
        function(dataset, prefetch_factors=2)
    assert "did you mean 'prefetch_factor'?" in str(raised.value)


def test_a_keyword_far_from_all_lists_them(text_ds):
    with pytest.raises(ArgumentTypeError) as raised:
        get_train_dataset(text_ds, **TRAIN, zzz=1)
    assert "none is close" in str(raised.value) and "decode_threads" in str(raised.value)


def test_the_named_options_reach_the_pipeline(text_ds):
    budget = ErrorBudget(max_skipped=3)
    spec = get_train_dataset(
        text_ds,
        **TRAIN,
        num_streams=4,
        parallel_shard_iters=2,
        global_batch_size=6,
        error_budget=budget,
        decode_threads=2,
        group_max_wait=9,
        subflavors={"origin": "web"},
    ).spec
    assert (spec.num_streams, spec.num_streams_fixed, spec.parallel_shard_iters) == (4, True, 2)
    assert (spec.global_batch_size, spec.decode_threads, spec.group_max_wait) == (6, 2, 9)
    assert spec.error_budget is budget
    assert {s.leaf.subflavors["origin"] for s in spec.sources} == {"web"}


def test_the_references_deprecated_keywords_still_work(text_ds):
    with pytest.warns(FutureWarning, match="deprecated"):
        dataset = get_val_dataset(
            text_ds, split_part="train", worker_config=WC, batch_size=None, auto_decode=False
        )
    assert dataset.spec.decoder is None
