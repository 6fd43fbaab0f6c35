"""The compat wrappers' stages read their saved fields through ``energon.state_fields`` (the
contract of ``Stage.restore`` in docs/internals-contracts.md): a damaged field of a saved
composition is a ``StateError`` that names the field, and their restore keys are checked on
use."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from energon import (
    BlendDataset,
    ConcatDataset,
    FilterDataset,
    IterMapDataset,
    MapDataset,
    RepeatDataset,
    ShuffleBufferDataset,
    WorkerConfig,
    get_savable_loader,
)
from energon.compat.dataset_config import get_dataset_from_config
from energon.errors import StateError
from energon.pipeline.keys import child_parts, members_parts

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)


def _same(sample):
    return sample


def _one_by_one(samples):
    yield from samples


def compose(path):
    """Shuffle(Blend(Concat(IterMap(Filter(leaf)), leaf), Repeat(Map(leaf))))."""

    def leaf():
        return get_dataset_from_config(path, training=True, worker_config=WC).build()

    filtered = FilterDataset(leaf(), filter_fn=lambda s: True, worker_config=WC)
    concat = ConcatDataset(
        IterMapDataset(filtered, _one_by_one, worker_config=WC), leaf(), worker_config=WC
    )
    mapped = RepeatDataset(MapDataset(leaf(), _same, worker_config=WC), worker_config=WC)
    blend = BlendDataset((concat, 1.0), (mapped, 1.0), worker_config=WC)
    return ShuffleBufferDataset(blend, 5, worker_config=WC)


@pytest.fixture(scope="module")
def saved(text_ds) -> dict[str, Any]:
    loader = get_savable_loader(compose(text_ds))
    it = iter(loader)
    for _ in range(7):
        next(it)
    return loader.save_state_rank()


@pytest.mark.parametrize(
    "sibling, field, value, named",
    [
        ("datasets", "exhausted", "x", "BlendDataset.exhausted"),
        ("exhausted", "datasets", [], "BlendDataset.datasets"),
        ("datasets", "current", -1, "ConcatDataset.current"),
        ("pending", "outputs", "3", "IterMapDataset.outputs"),
        ("index", "repetition", 1.5, "RepeatDataset.repetition"),
        ("rng", "buffer", list(range(99)), "ShuffleBufferDataset.buffer"),
        ("buffer", "exhausted", "no", "ShuffleBufferDataset.exhausted"),
        ("inputs", "upstream", None, "FilterDataset.upstream' is missing"),
    ],
)
def test_a_damaged_field_of_a_composition_is_a_state_error_naming_it(
    text_ds, saved, sibling, field, value, named
):
    """``field`` of the node whose state also holds ``sibling`` is damaged (None: removed)."""
    state = copy.deepcopy(saved)
    assert _damage_with(state, sibling, field, value)
    loader = get_savable_loader(compose(text_ds))
    with pytest.raises(StateError, match=re.escape(named)):
        loader.restore_state_rank(state)
        next(iter(loader))


def _damage_with(data: Any, sibling: str, name: str, value: Any) -> bool:
    """Set ``name`` in the first mapping that also has ``sibling`` (None: remove it)."""
    if isinstance(data, dict):
        if sibling in data and name in data:
            if value is None:
                del data[name]
            else:
                data[name] = value
            return True
        return any(_damage_with(v, sibling, name, value) for v in data.values())
    if isinstance(data, list):
        return any(_damage_with(v, sibling, name, value) for v in data)
    return False


def test_the_saved_state_restores_undamaged(text_ds, saved):
    """The damage above is what fails: the same state, untouched, restores and goes on."""
    expected = get_savable_loader(compose(text_ds))
    it = iter(expected)
    for _ in range(7):
        next(it)
    loader = get_savable_loader(compose(text_ds))
    loader.restore_state_rank(copy.deepcopy(saved))
    assert next(iter(loader)).__key__ == next(it).__key__


def test_composition_keys_are_checked_on_use():
    assert child_parts(("BlendDataset", 1, ("webdataset", 0, 3)), "BlendDataset", 2) == (
        1,
        ("webdataset", 0, 3),
    )
    with pytest.raises(StateError, match="BlendDataset"):
        child_parts(("BlendDataset", 2, ("webdataset", 0, 3)), "BlendDataset", 2)
    with pytest.raises(StateError, match="ConcatDataset"):
        child_parts(("BlendDataset", 0, ("webdataset", 0, 3)), "ConcatDataset", 2)
    with pytest.raises(StateError, match="IterMapDataset"):
        members_parts(("IterMapDataset", 0, "x"), "IterMapDataset")
