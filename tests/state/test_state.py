"""Save and restore: exact continuation, elastic re-layout, plain-data states, clear errors."""

from __future__ import annotations

import io
import json

import pytest
import torch

from energon import (
    StateError,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    redistribute_states,
)


def make_loader(path, *, rank=0, world_size=1, num_workers=0, num_streams=None, **kwargs):
    wc = WorkerConfig(rank=rank, world_size=world_size, num_workers=num_workers)
    options = dict(batch_size=3, shuffle_buffer_size=7, max_samples_per_sequence=5)
    options.update(kwargs)
    if num_streams is not None:
        options["num_streams"] = num_streams
    return get_savable_loader(get_train_dataset(path, worker_config=wc, **options))


def take(it, n):
    return [next(it) for _ in range(n)]


def keys(batches):
    return [tuple(b.__key__) for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("save_at", [0, 1, 5, 23])
def test_restore_continues_exactly(captioning_ds, num_workers, save_at):
    loader = make_loader(captioning_ds, num_workers=num_workers)
    it = iter(loader)
    take(it, save_at)
    state = loader.save_state_rank()
    expected = take(it, 12)

    restored = make_loader(captioning_ds, num_workers=num_workers)
    restored.restore_state_rank(json.loads(json.dumps(state)))
    got = take(iter(restored), 12)
    assert keys(got) == keys(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a.image, b.image)
        assert a.caption == b.caption


def test_restore_with_other_worker_count(text_ds):
    loader = make_loader(text_ds, num_workers=2)
    it = iter(loader)
    take(it, 9)
    state = loader.save_state_rank()
    expected = keys(take(it, 15))
    for workers in (0, 1, 3):
        restored = make_loader(text_ds, num_workers=workers)
        restored.restore_state_rank(state)
        assert keys(take(iter(restored), 15)) == expected, workers


def test_repeated_save_restore_cycles(text_ds):
    reference = keys(take(iter(make_loader(text_ds, num_workers=0)), 40))
    got = []
    state = None
    for cycle in range(5):
        loader = make_loader(text_ds, num_workers=2 if cycle % 2 else 0)
        loader.restore_state_rank(state)
        if state is not None:
            assert loader.save_state_rank() == state, "saving right after restoring is a no-op"
        got += keys(take(iter(loader), 8))
        state = loader.save_state_rank()
    assert got == reference


def test_state_survives_virtual_epochs(text_ds):
    loader = make_loader(text_ds, virtual_epoch_length=5)
    first_pass = keys(loader)
    it = iter(loader)
    take(it, 2)
    state = loader.save_state_rank()
    rest_of_pass = keys(it)
    assert len(rest_of_pass) == 3
    restored = make_loader(text_ds, virtual_epoch_length=5)
    restored.restore_state_rank(state)
    assert keys(restored) == rest_of_pass
    assert len(first_pass) == 5


def test_state_is_plain_data_and_loads_with_weights_only(text_ds):
    loader = make_loader(text_ds, num_workers=2)
    it = iter(loader)
    take(it, 4)
    state = loader.save_state_rank()
    assert json.loads(json.dumps(state)) == state
    buf = io.BytesIO()
    torch.save({"dataloader_state_dict": state}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["dataloader_state_dict"]
    expected = keys(take(it, 5))
    restored = make_loader(text_ds, num_workers=2)
    restored.restore_state_rank(loaded)
    assert keys(take(iter(restored), 5)) == expected
    assert len(json.dumps(state)) < 20_000, "the state holds pointers, not samples"


def run_ranks(path, world_size, num_workers, steps, states=None, num_streams=4):
    """Each rank takes ``steps`` micro-batches; returns the global order and the ranks' states."""
    loaders, per_rank = [], []
    for rank in range(world_size):
        loader = make_loader(
            path, rank=rank, world_size=world_size, num_workers=num_workers, num_streams=num_streams
        )
        if states is not None:
            loader.restore_state_rank(states[rank])
        per_rank.append(keys(take(iter(loader), steps)))
        loaders.append(loader)
    order = [per_rank[r][k] for k in range(steps) for r in range(world_size)]
    return order, [loader.save_state_rank() for loader in loaders]


@pytest.mark.parametrize("new_world_size,new_workers", [(1, 0), (3, 1), (4, 2), (2, 0)])
def test_elastic_restore_continues_the_global_sequence(text_ds, new_world_size, new_workers):
    reference, _ = run_ranks(text_ds, 1, 0, 36)
    before, states = run_ranks(text_ds, 2, 2, 6)
    assert before == reference[:12]
    new_states = redistribute_states(states, new_world_size)
    steps = 24 // new_world_size
    after, _ = run_ranks(text_ds, new_world_size, new_workers, steps, states=new_states)
    assert after == reference[12 : 12 + len(after)]


def test_elastic_restore_when_ranks_are_one_step_apart(text_ds):
    reference, _ = run_ranks(text_ds, 1, 0, 30)
    loaders = [make_loader(text_ds, rank=r, world_size=2, num_streams=4) for r in range(2)]
    its = [iter(loader) for loader in loaders]
    take(its[0], 5)
    take(its[1], 4)
    states = [loader.save_state_rank() for loader in loaders]
    new = redistribute_states(states, 1)
    restored = make_loader(text_ds, num_streams=4)
    restored.restore_state_rank(new[0])
    assert keys(take(iter(restored), 10)) == reference[9:19]


def test_restore_errors_are_clear(text_ds, text_val_ds, captioning_ds):
    loader = make_loader(text_ds)
    take(iter(loader), 2)
    state = loader.save_state_rank()

    with pytest.raises(StateError, match="different dataset or loader configuration"):
        make_loader(captioning_ds).restore_state_rank(state)
    with pytest.raises(StateError, match="batch_size"):
        make_loader(text_ds, batch_size=4).restore_state_rank(state)
    with pytest.raises(StateError, match="rank 0 of 1"):
        make_loader(text_ds, rank=1, world_size=2).restore_state_rank(state)
    damaged = dict(state)
    del damaged["streams"]
    with pytest.raises(StateError, match="streams"):
        make_loader(text_ds).restore_state_rank(damaged)
    with pytest.raises(StateError, match="format"):
        make_loader(text_ds).restore_state_rank({"worker_states": []})
    started = make_loader(text_ds)
    take(iter(started), 1)
    with pytest.raises(StateError, match="before iterating"):
        started.restore_state_rank(state)
    val = get_savable_loader(
        get_val_dataset(
            text_val_ds,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=3,
        )
    )
    with pytest.raises(StateError, match="training"):
        val.restore_state_rank(state)


def test_val_loader_restores_mid_pass(text_val_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    loader = get_savable_loader(get_val_dataset(text_val_ds, worker_config=wc, batch_size=3))
    it = iter(loader)
    take(it, 4)
    state = loader.save_state_rank()
    rest = keys(it)
    restored = get_savable_loader(get_val_dataset(text_val_ds, worker_config=wc, batch_size=3))
    restored.restore_state_rank(state)
    assert keys(restored) == rest
    assert len(keys(restored)) == 14, "the next pass is a full pass again"


def test_restore_sample_regenerates_batches(captioning_ds):
    loader = make_loader(captioning_ds, num_workers=2)
    it = iter(loader)
    batches = take(it, 4)
    assert loader.can_restore_sample()
    for batch in batches:
        again = loader.restore_sample(batch.__restore_key__)
        assert again.__key__ == batch.__key__
        assert torch.equal(again.image, batch.image)


def _pointer_tags(data):
    """The tags of every pointer key ``[kind, source, index]`` in saved data."""
    if isinstance(data, dict):
        return set().union(*map(_pointer_tags, data.values())) if data else set()
    if isinstance(data, list | tuple):
        if len(data) == 3 and isinstance(data[0], str) and all(type(x) is int for x in data[1:]):
            return {data[0]}
        return set().union(*map(_pointer_tags, data)) if data else set()
    return set()


def _as_version_1(data):
    """A state as energon wrote it with state version 1 (every pointer tagged "Webdataset")."""
    if isinstance(data, dict):
        return {k: _as_version_1(v) for k, v in data.items()}
    if isinstance(data, list):
        if len(data) == 3 and data[0] == "webdataset" and all(type(x) is int for x in data[1:]):
            return ["Webdataset", *data[1:]]
        return [_as_version_1(x) for x in data]
    return data


def test_pointer_keys_name_their_kind_and_version_1_states_are_translated(text_ds):
    loader = make_loader(text_ds, max_samples_per_sequence=5, shuffle_buffer_size=9)
    it = iter(loader)
    batch = take(it, 3)[-1]
    assert _pointer_tags(batch.__restore_key__) == {"webdataset"}
    state = loader.save_state_rank()
    assert state["version"] == 2
    assert _pointer_tags(state["streams"]) == {"webdataset"}, "the shuffle buffer holds pointers"
    expected = keys(take(it, 6))

    old = _as_version_1(dict(state, version=1))
    assert _pointer_tags(old["streams"]) == {"Webdataset"}
    restored = make_loader(text_ds, max_samples_per_sequence=5, shuffle_buffer_size=9)
    restored.restore_state_rank(old)
    batches = take(iter(restored), 6)
    assert keys(batches) == expected
    assert all(_pointer_tags(b.__restore_key__) == {"webdataset"} for b in batches)
    again = restored.save_state_rank()
    assert again["version"] == 2 and _pointer_tags(again["streams"]) == {"webdataset"}

    with pytest.raises(StateError, match="unsupported loader state version 99"):
        make_loader(text_ds).restore_state_rank(dict(state, version=99))


def test_redistribution_keeps_the_version_of_its_states(text_ds):
    _, states = run_ranks(text_ds, 2, 0, 3)
    old = [_as_version_1(dict(s, version=1)) for s in states]
    assert {s["version"] for s in redistribute_states(old, 3)} == {1}
    with pytest.raises(StateError, match="disagree on version"):
        redistribute_states([old[0], states[1]], 1)


def test_a_changed_blend_weight_is_shown_where_it_differs(tmp_path, text_ds):
    """Issue 33: the message cut the ``datasets`` field short, so saved and current read the same."""
    from tests.helpers.datasets import make_text_dataset
    from tests.ledger.runs import write_blend

    other = make_text_dataset(tmp_path / "b", num_samples=40, num_shards=2, seed=3)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = write_blend(tmp_path / "old", [text_ds, other], [0.6, 0.4])
    new = write_blend(tmp_path / "new", [text_ds, other], [0.5, 0.5])
    loader = make_loader(old)
    take(iter(loader), 2)
    with pytest.raises(StateError) as raised:
        make_loader(new).restore_state_rank(loader.save_state_rank())
    message = str(raised.value)
    assert "datasets[0].weight: saved 0.6 != now 0.5" in message
    assert "datasets[1].weight: saved 0.4 != now 0.5" in message
