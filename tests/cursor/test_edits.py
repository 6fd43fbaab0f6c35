"""Cursor edits: skip == consuming the batches; exclusion never delivers an excluded sample and
leaves the others' order unchanged; migration keeps continuing sources exactly-once within their
epoch; all of it survives save/restore and elastic restore, and the ledger follows."""

from __future__ import annotations

import copy
import dataclasses
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energon import get_savable_loader, redistribute_states
from energon.cursor.exclude import exclude_samples
from energon.cursor.migrate import migrate_states
from energon.cursor.skip import skip_steps
from energon.errors import NotSimulableError, StateError
from energon.ledger.ledger import Ledger
from energon.pipeline.keys import pointer_target, pointers_of
from energon.pipeline.pointers import pointer_source
from energon.plan.edits import edits_from_json
from energon.state import check_state_shape
from tests.helpers.datasets import make_text_dataset
from tests.ledger.runs import (
    CONFIGS,
    DataPackingEncoder,
    MetaPackingEncoder,
    run_ranks,
    train_dataset,
    write_blend,
)

STEPS = 30


@pytest.fixture(scope="module")
def data(tmp_path_factory, text_ds):
    folder = tmp_path_factory.mktemp("cursor")
    b = make_text_dataset(folder / "b", num_samples=60, num_shards=3, seed=11)
    c = make_text_dataset(folder / "c", num_samples=50, num_shards=2, seed=12)
    (folder / "new").mkdir()
    return {
        "single": str(text_ds),
        "blend": str(write_blend(folder, [text_ds, b], [0.6, 0.4])),
        "a": str(text_ds),
        "b": str(b),
        "c": str(c),
        "folder": folder,
    }


@cache
def _run(path, world_size, steps, config):
    return run_ranks(path, world_size, steps, num_streams=4, **CONFIGS[config])


def _continue(path, world_size, states, steps, **config):
    delivered, _ = run_ranks(path, world_size, steps, states=states, num_streams=4, **config)
    return delivered


# -- skip --------------------------------------------------------------------------------------


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    source=st.sampled_from(["single", "blend"]),
    config=st.sampled_from(["plain", "shuffled"]),
    world_size=st.sampled_from([1, 2, 3]),
    saved_at=st.integers(0, 6),
    skipped=st.integers(0, 8),
    rebuild=st.booleans(),
)
def test_skip_equals_consuming_the_batches(
    data, source, config, world_size, saved_at, skipped, rebuild
):
    path = data[source]
    delivered, _ = _run(path, world_size, STEPS, config)
    _, states = _run(path, world_size, saved_at, config)
    dataset = (
        None
        if rebuild
        else train_dataset(path, world_size=world_size, num_streams=4, **CONFIGS[config])
    )
    new_states, report = skip_steps(states, skipped, dataset=dataset)
    assert report.end - report.start == skipped * world_size
    after = _continue(path, world_size, new_states, 4, **CONFIGS[config])
    assert after == delivered[saved_at + skipped : saved_at + skipped + 4]
    regrown = _continue(path, 4, redistribute_states(new_states, 4), 2, **CONFIGS[config])
    flat = [k for step in delivered[saved_at + skipped :] for k in step]
    assert [k for step in regrown for k in step] == flat[:8]  # elastic restore after a skip
    ledger = Ledger(
        train_dataset(path, world_size=world_size, num_streams=4, **CONFIGS[config]),
        states=new_states,
    )
    for step in range(saved_at, saved_at + skipped + 2):
        records = ledger.describe_step(step)
        expected = "skipped" if step < saved_at + skipped else "seen"
        assert {r.status for r in records} == {expected}
        assert [r.restore_key for r in records] == delivered[step]


def test_skip_with_packing_from_metadata_and_from_data(data):
    path = data["blend"]
    for encoder in (MetaPackingEncoder, DataPackingEncoder):
        config = dict(
            CONFIGS["shuffled"], batch_size=2, packing_buffer_size=5, task_encoder=encoder()
        )
        delivered, _ = run_ranks(path, 2, 14, num_streams=4, **config)
        _, states = run_ranks(path, 2, 3, num_streams=4, **config)
        dataset = train_dataset(path, world_size=2, num_streams=4, **config)
        if encoder is DataPackingEncoder:
            with pytest.raises(NotSimulableError, match="select_samples_to_pack"):
                skip_steps(states, 5, dataset=dataset)
            new_states, report = skip_steps(states, 5, dataset=dataset, read_data=True)
            assert report.read_data
        else:
            new_states, _ = skip_steps(states, 5)  # configuration rebuilt from the state alone
        after = _continue(path, 2, new_states, 6, **config)
        assert after == delivered[8:14]


# -- exclude -----------------------------------------------------------------------------------


def _keys(records):
    return [r.restore_key for r in records]


def _samples(delivered_steps):
    """Per stream, the (source, index) of every delivered sample, in order."""
    streams: dict[int, list] = {}
    for step in delivered_steps:
        for key in step:
            streams.setdefault(key[1], []).extend(pointer_target(p) for p in pointers_of(key))
    return streams


def _keys_of(path, pointers):
    """Sample keys (through the ledger's metadata) of some pointers of a single-source config."""
    ledger = Ledger(train_dataset(path, num_streams=4))
    from energon.source.meta import SampleMeta, meta_reader

    reader = meta_reader(ledger.spec.sources[0].leaf)
    return [SampleMeta(reader, 0, index).key for _, index in pointers]


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    config=st.sampled_from(["plain", "shuffled"]),
    world_size=st.sampled_from([1, 2]),
    saved_at=st.integers(0, 5),
    by=st.sampled_from(["keys", "shard", "dataset"]),
    new_world_size=st.sampled_from([1, 2, 3]),
)
def test_exclusion_drops_only_the_excluded(data, config, world_size, saved_at, by, new_world_size):
    path = data["blend"]
    delivered, _ = _run(path, world_size, 3 * STEPS, config)
    _, states = _run(path, world_size, saved_at, config)
    future = [p for stream in _samples(delivered[saved_at:]).values() for p in stream]
    if by == "keys":
        chosen = [p for p in future if p[0] == 0][:6:2]
        kwargs = {"keys": _keys_of(data["single"], chosen), "within": [data["a"]]}
        excluded = set(chosen)
    elif by == "shard":
        kwargs = {"shards": ["parts/data-00001.tar"], "within": [data["a"]]}
        excluded = {(0, i) for i in range(24, 48)}  # text_ds: 120 samples in 5 shards of 24
    else:
        kwargs = {"datasets": [data["b"]]}
        excluded = {(1, i) for i in range(60)}
    new_states, report = exclude_samples(states, **kwargs)
    assert sum(d["samples"] for d in report.datasets) == len(excluded)
    cfg = CONFIGS[config]
    first = _continue(path, world_size, new_states, 6, **cfg)
    # save, redistribute to another world size, continue: the exclusion is still in force
    _, mid = run_ranks(path, world_size, 6, states=new_states, num_streams=4, **cfg)
    second = _continue(path, new_world_size, redistribute_states(mid, new_world_size), 6, **cfg)
    got = _samples(first + second)
    before = _samples(delivered[saved_at:])
    for stream, samples in got.items():
        assert not set(samples) & excluded
        expected = [p for p in before[stream] if p not in excluded]
        assert samples == expected[: len(samples)]
    # the ledger follows: after the edit, and (from later states) the steps before it
    ledger = Ledger(
        train_dataset(path, world_size=world_size, num_streams=4, **cfg), states=new_states
    )
    records = [r for n in range(saved_at, saved_at + 6) for r in ledger.describe_step(n)]
    assert [r.restore_key for r in records] == [k for step in first for k in step]
    # each record names the excluded samples dropped while it was made: with the delivered ones
    # they are exactly the old sequence up to the last delivered sample
    for stream in got:
        kept = [(s.source, s.index) for r in records if r.stream == stream for s in r.samples]
        dropped = [(s.source, s.index) for r in records if r.stream == stream for s in r.excluded]
        assert set(dropped) <= excluded
        assert sorted(kept + dropped) == sorted(before[stream][: len(kept) + len(dropped)])
    if saved_at:  # a step before the edit, from states saved after it: replayed from the plan
        history = Ledger(
            train_dataset(path, world_size=world_size, num_streams=4, **cfg), states=mid
        )
        assert _keys(history.describe_step(saved_at - 1)) == delivered[saved_at - 1]


# -- migrate -----------------------------------------------------------------------------------


def _blend(data, name, entries):
    folder = data["folder"] / "new" / name
    folder.mkdir(exist_ok=True)
    return str(write_blend(folder, [data[k] for k, _ in entries], [w for _, w in entries]))


@pytest.mark.parametrize("config", ["plain", "shuffled"])
def test_migration_keeps_continuing_sources_in_place(data, config):
    cfg = CONFIGS[config]
    old = _blend(data, "old", [("a", 0.5), ("b", 0.5)])
    new = _blend(data, "new", [("c", 0.2), ("b", 0.8)])  # a removed, c added, b reweighted
    before, states = run_ranks(old, 2, 5, num_streams=4, **cfg)
    new_dataset = train_dataset(new, world_size=2, num_streams=4, **cfg)
    with pytest.raises(StateError, match="different dataset or loader configuration"):
        get_savable_loader(
            train_dataset(new, world_size=2, num_streams=4, **cfg)
        ).restore_state_rank(states[0])
    new_states, report = migrate_states(states, new_dataset)
    lines = "\n".join(report.lines())
    assert "removed" in lines and "added" in lines and "weight 0.5 -> 0.8" in lines
    assert [c["old_source"] for c in report.continuing] == [1]
    after = _continue(new, 2, new_states, 30, **cfg)
    old_spec = train_dataset(old, world_size=2, num_streams=4, **cfg).spec
    edited_spec = dataclasses.replace(
        new_dataset.spec, edits=edits_from_json(new_states[0]["edits"])
    )
    got_before, got_after = _samples(before), _samples(after)
    for stream in range(4):
        b_samples = [i for s, i in got_before.get(stream, []) if s == 1] + [
            i for s, i in got_after.get(stream, []) if s == 1
        ]
        reader = pointer_source(old_spec, stream).readers[1]
        reads = [reader.next() for _ in range(len(b_samples) + (cfg["shuffle_buffer_size"] or 0))]
        if not cfg["shuffle_buffer_size"]:
            assert b_samples == reads[: len(b_samples)]  # b continues exactly where it was
        for index in set(b_samples):
            assert b_samples.count(index) <= reads.count(index)  # never more often than read
        c_samples = [i for s, i in got_after.get(stream, []) if s == 0]
        c_reader = pointer_source(edited_spec, stream).readers[0]  # starts at its beginning
        c_reads = [
            c_reader.next() for _ in range(len(c_samples) + (cfg["shuffle_buffer_size"] or 0))
        ]
        if not cfg["shuffle_buffer_size"]:
            assert c_samples == c_reads[: len(c_samples)]
        assert set(c_samples) <= set(c_reads)
    # the removed dataset is never delivered again; continuing ones are read from their datasets
    removed_path = data["a"]
    ledger = Ledger(train_dataset(new, world_size=2, num_streams=4, **cfg), states=new_states)
    records = [r for n in range(5, 12) for r in ledger.describe_step(n)]
    assert [r.restore_key for r in records] == [k for step in after[:7] for k in step]
    assert all(s.dataset != removed_path for r in records for s in r.samples)
    with pytest.raises(StateError, match="before a migration"):
        ledger.describe_step(0)
    # elastic restore of the migrated state
    regrown = _continue(new, 3, redistribute_states(new_states, 3), 4, **cfg)
    flat_after = [k for step in after for k in step]
    assert [k for step in regrown for k in step] == flat_after[: len(regrown) * 3]


def test_migration_refuses_other_setting_changes(data):
    old = _blend(data, "old2", [("a", 0.5), ("b", 0.5)])
    _, states = run_ranks(old, 1, 2, num_streams=4, **CONFIGS["plain"])
    other = train_dataset(old, num_streams=4, **dict(CONFIGS["plain"], batch_size=4))
    with pytest.raises(StateError, match="batch_size"):
        migrate_states(states, other)


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: e.update(version=99),
        lambda e: e.update(exclude=[{"path": "x", "split_part": "train", "ranges": [[5, 2]]}]),
        lambda e: e.update(sources=[{"id": 0, "rotation": -1}]),
        lambda e: e.update(history=[{"edit": "skip", "start": 9, "end": 3}]),
        lambda e: e.update(history=[{"edit": "exclude", "position": 0}]),
        lambda e: e.update(history="nope"),
    ],
)
def test_damaged_edits_are_rejected(data, damage):
    _, states = _run(data["single"], 1, 2, "plain")
    edited, _ = skip_steps(states, 1)
    state = copy.deepcopy(edited[0])
    damage(state["edits"])
    with pytest.raises(StateError, match="edits"):
        check_state_shape(state)


def test_epochized_migration_keeps_continuing_sources_in_place(data):
    cfg = CONFIGS["plain"]
    folder = data["folder"] / "new"
    (folder / "eo").mkdir(exist_ok=True)
    (folder / "en").mkdir(exist_ok=True)
    old = str(write_blend(folder / "eo", [data["a"], data["b"]], [1, 2], epochized=True))
    new = str(write_blend(folder / "en", [data["c"], data["b"]], [1, 1], epochized=True))
    before, states = run_ranks(old, 2, 10, num_streams=4, **cfg)
    new_states, report = migrate_states(
        states, train_dataset(new, world_size=2, num_streams=4, **cfg)
    )
    assert "repetitions 2 -> 1" in "\n".join(report.lines())
    after = _continue(new, 2, new_states, 40, **cfg)
    old_spec = train_dataset(old, world_size=2, num_streams=4, **cfg).spec
    got_before, got_after = _samples(before), _samples(after)
    for stream in range(4):
        b_samples = [i for s, i in got_before.get(stream, []) + got_after.get(stream, []) if s == 1]
        reader = pointer_source(old_spec, stream).readers[1]
        assert b_samples == [reader.next() for _ in b_samples]
