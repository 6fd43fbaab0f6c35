"""States are validated, not trusted: absurd or edited values are a ``StateError`` naming the field,
at restore time (before anything runs), instead of a hang or a silently different order."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re

import pytest

from energon import (
    DefaultTaskEncoder,
    StateError,
    TextSample,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    redistribute_states,
)
from energon.pipeline.spec import fingerprint_digest
from energon.source.webdataset import WebdatasetLeaf
from tests.state.test_state import keys, make_loader, take
from tests.task_encoder.test_packing_grouping import packed_loader


@pytest.fixture(scope="module")
def saved(text_ds):
    """A training state saved mid-epoch with a filled shuffle buffer (2 workers, 2 streams)."""
    loader = make_loader(text_ds, num_workers=2)
    take(iter(loader), 5)
    return loader.save_state_rank()


def restore(text_ds, state, **kwargs):
    options = {"num_workers": 2, **kwargs}
    loader = make_loader(text_ds, **options)
    loader.restore_state_rank(state)
    return loader


def edited(state, change):
    state = copy.deepcopy(state)
    change(state)
    return state


def pointer_state(state, stream=0):
    return next(s for i, s in state["streams"] if i == stream)["stages"][0]


def shuffle_state(state, stream=0):
    return next(s for i, s in state["streams"] if i == stream)["stages"][1]


def test_an_untouched_state_restores(text_ds, saved):
    assert len(take(iter(restore(text_ds, saved)), 3)) == 3


def test_a_state_that_lists_every_shard_in_its_fingerprint_still_restores(text_ds, saved):
    """States saved before the shard table listed each dataset's shards in full."""
    leaf = WebdatasetLeaf.open(text_ds, split_part="train")
    old = copy.deepcopy(saved)
    listed = [[name, count] for name, count in zip(leaf.shard_names, leaf.shard_counts)]
    old["fingerprint"]["datasets"][0]["shards"] = listed
    old["fingerprint_digest"] = fingerprint_digest(old["fingerprint"])
    assert old["fingerprint_digest"] != saved["fingerprint_digest"]
    after = take(iter(restore(text_ds, old)), 3)
    assert keys(after) == keys(take(iter(restore(text_ds, saved)), 3))
    listed[0][1] += 1  # a different dataset is still refused
    old["fingerprint_digest"] = fingerprint_digest(old["fingerprint"])
    with pytest.raises(StateError, match="different dataset"):
        restore(text_ds, old)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: s.__setitem__("consumed", 10**15), "consumed"),
        (lambda s: s.__setitem__("consumed", -1), "consumed"),
        (lambda s: s.__setitem__("consumed", True), "consumed"),
        (lambda s: s.__setitem__("origin", -5), "origin"),
        (lambda s: s.__setitem__("num_streams", 10**7), "num_streams"),
        (lambda s: s.__setitem__("num_streams", 0), "num_streams"),
        (lambda s: s.__setitem__("num_streams", 200), "num_streams"),  # > the 120 samples
        (lambda s: s.__setitem__("rank", 3), "rank"),
        (lambda s: s.__setitem__("world_size", 0), "world_size"),
        (lambda s: s.__setitem__("pass_offset", -2), "pass_offset"),
        (lambda s: s.__setitem__("micro_batch_size", 0), "micro_batch_size"),
        (lambda s: s["streams"].append([0, s["streams"][0][1]]), "streams"),
        (lambda s: s["streams"].append([9, s["streams"][0][1]]), "streams[2][0]"),
        (lambda s: s["streams"][0][1].__setitem__("emitted", -1), "streams[0].emitted"),
        (lambda s: s["streams"][0][1].__setitem__("emitted", 10**9), "streams[0].emitted"),
        (lambda s: s["streams"][0][1].__setitem__("stages", []), "streams[0].stages"),
        (lambda s: s["fingerprint"].__setitem__("seed", 1234), "fingerprint"),
        (
            lambda s: s["fingerprint"]["datasets"][0]["shards"].__setitem__("count", 1),
            "fingerprint",
        ),
    ],
)
def test_absurd_top_level_values_name_the_field(text_ds, saved, change, field):
    with pytest.raises(StateError, match="field '" + re.escape(field)):
        restore(text_ds, edited(saved, change))


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda p: p["readers"][0].__setitem__("epoch", -1), "pointers.readers[0].epoch"),
        (lambda p: p["readers"][0].__setitem__("pos", -3), "pointers.readers[0].pos"),
        (lambda p: p["readers"][0].__setitem__("pos", 10**6), "pointers.readers[0].pos"),
        (lambda p: p["readers"][0].__setitem__("rng", -1), "pointers.readers[0].rng"),
        (lambda p: p["readers"][0].__setitem__("started", "yes"), "pointers.readers[0].started"),
        (
            lambda p: p["readers"][0]["active"][0].__setitem__(1, -7),
            "pointers.readers[0].active[0][1]",
        ),
        (
            lambda p: p["readers"][0]["active"][0].__setitem__(1, 10**9),
            "pointers.readers[0].active[0][1]",
        ),
        (
            lambda p: p["readers"][0]["active"][0].__setitem__(0, 999),
            "pointers.readers[0].active[0][0]",
        ),
        (
            lambda p: p["readers"][0].__setitem__("active", [[0, 0]] * 100),
            "pointers.readers[0].active",
        ),
        (lambda p: p.__setitem__("readers", []), "pointers.readers"),
        (lambda p: p.__setitem__("current", 5), "pointers.current"),
    ],
)
def test_bad_reader_cursors_name_stream_stage_and_field(text_ds, saved, change, field):
    state = edited(saved, lambda s: change(pointer_state(s)))
    with pytest.raises(StateError, match=r"streams\[0\]\.stages\[0\] \(PointerSource\)") as raised:
        restore(text_ds, state)
    assert f"'{field}'" in str(raised.value)


def test_huge_or_foreign_shuffle_buffers_are_refused(text_ds, saved):
    shuffle = shuffle_state(saved)
    assert shuffle["buffer"], "the fixture saves with a filled buffer"
    kind, source, index = shuffle["buffer"][0]
    for buffer, message in [
        ([[kind, source, index]] * 1000, "shuffle.buffer' holds 1000 entries"),
        ([[kind, source, 10**6]], "points outside this stream's samples"),
        ([[kind, source, -1]], "points outside this stream's samples"),
        ([[kind, 3, index]], "names source 3"),
        (["jsonl", source, index], "is not a sample pointer"),
        ([["jsonl", source, index]], "names source 0 of kind 'jsonl'"),
    ]:
        state = edited(saved, lambda s, b=buffer: shuffle_state(s).__setitem__("buffer", b))
        with pytest.raises(StateError, match=r"streams\[0\]\.stages\[1\] \(ShuffleBuffer\)") as e:
            restore(text_ds, state)
        assert message in str(e.value)


def test_a_pointer_of_another_stream_is_refused(text_ds, saved):
    """Stream 1's samples in stream 0's buffer would silently be read twice."""
    other = shuffle_state(saved, 1)["buffer"][0]
    state = edited(saved, lambda s: shuffle_state(s)["buffer"].__setitem__(0, other))
    with pytest.raises(StateError, match="points outside this stream's samples"):
        restore(text_ds, state)


def test_a_pass_offset_beyond_the_virtual_epoch_is_refused(text_ds):
    loader = make_loader(text_ds, virtual_epoch_length=4)
    take(iter(loader), 2)
    state = loader.save_state_rank()
    bad = edited(state, lambda s: s.__setitem__("pass_offset", 99))
    with pytest.raises(StateError, match="'pass_offset' is 99, beyond the pass of 4"):
        restore(text_ds, bad, num_workers=0, virtual_epoch_length=4)


def test_redistributed_and_elastic_states_still_pass_the_checks(text_ds):
    states, seen = [], []
    for rank in range(2):
        loader = make_loader(text_ds, rank=rank, world_size=2, num_workers=1, num_streams=4)
        seen += [k for b in take(iter(loader), 3 + rank) for k in b.__key__]  # rank 1: a step ahead
        states.append(loader.save_state_rank())
    for world_size in (1, 3, 4):
        resumed = []
        for rank, state in enumerate(redistribute_states(states, world_size)):
            loader = make_loader(
                text_ds, rank=rank, world_size=world_size, num_workers=1, num_streams=4
            )
            loader.restore_state_rank(state)
            resumed += [k for b in take(iter(loader), 2) for k in b.__key__]
        assert len(set(resumed)) == len(resumed) and not set(resumed) & set(seen)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_packing_buffers_beyond_their_size_are_refused_in_the_worker(text_ds, num_workers):
    from energon.pipeline.snapshot import stage_states

    loader = packed_loader(text_ds, num_workers)
    it = iter(loader)
    for _ in range(30):
        next(it)
        state = loader.save_state_rank()
        packing = [stage_states(s)[4] for _, s in state["streams"]]
        if any(p["reading"] or p["pending"] for p in packing):
            break
    stream, pack = next(
        (i, stage_states(s)[4])
        for i, s in state["streams"]
        if stage_states(s)[4]["reading"] or stage_states(s)[4]["pending"]
    )
    key = (pack["reading"] or pack["pending"][0])[0]

    def grow(s):
        next(x for i, x in s["streams"] if i == stream)["stages"][4]["reading"] = [key] * 50

    again = packed_loader(text_ds, num_workers)
    again.restore_state_rank(edited(state, grow))
    with pytest.raises(
        StateError, match=rf"streams\[{stream}\]\.stages\[4\] \(PackStage\).*pack\.reading"
    ):
        take(iter(again), 4)  # every stream restores on its first item


class TwoPerSample(DefaultTaskEncoder):
    """A generator encode_sample: two outputs per sample."""

    def encode_sample(self, sample):
        yield sample
        yield TextSample.derive_from(sample, text=sample.text.upper())


def generator_loader(text_ds):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_train_dataset(
        text_ds,
        worker_config=wc,
        batch_size=3,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=TwoPerSample(),
    )
    return get_savable_loader(dataset)


def test_a_generator_replay_beyond_its_outputs_is_refused(text_ds):
    assert inspect.isgeneratorfunction(TwoPerSample.encode_sample)
    loader = generator_loader(text_ds)
    it = iter(loader)
    for _ in range(10):
        next(it)
        state = loader.save_state_rank()
        pending = state["streams"][0][1]["stages"][2]["pending"]
        if pending is not None:
            break
    assert pending is not None
    for emitted, message in [(7, "makes only 2"), (10**12, "pending\\[2\\]' is")]:
        bad = edited(
            state, lambda s, e=emitted: s["streams"][0][1]["stages"][2]["pending"].__setitem__(2, e)
        )
        again = generator_loader(text_ds)
        again.restore_state_rank(bad)
        with pytest.raises(StateError, match=message):
            next(iter(again))


def _replace_pointers(key, index):
    if isinstance(key, tuple) and len(key) == 3 and key[0] == "webdataset":
        return (key[0], key[1], index)
    if isinstance(key, tuple):
        return tuple(_replace_pointers(k, index) for k in key)
    return key


def test_malformed_keys_in_a_restore_key_are_state_errors(text_ds):
    loader = make_loader(text_ds, num_workers=0)
    batch = next(iter(loader))
    key = batch.__restore_key__
    assert loader.restore_sample(key).__key__ == batch.__key__
    broken = []
    loader.worker_config = dataclasses.replace(
        loader.worker_config, restore_error_handler=lambda e, *_: broken.append(e)
    )
    assert loader.restore_sample(_replace_pointers(key, 10**6)) is None
    assert isinstance(broken[0], StateError) and "points outside" in str(broken[0])
    malformed = (*key[:3], (key[3][0], key[3][1], "x"))
    assert loader.restore_sample(malformed) is None
    assert isinstance(broken[1], StateError) and "is not a" in str(broken[1])


def test_redistributing_a_tampered_state_is_refused_not_looped(text_ds):
    states = []
    for rank in range(2):
        loader = make_loader(text_ds, rank=rank, world_size=2, num_workers=0, num_streams=4)
        take(iter(loader), 2)
        states.append(loader.save_state_rank())
    states[1] = edited(states[1], lambda s: s.__setitem__("consumed", 10**15))
    with pytest.raises(StateError, match="positions apart"):
        redistribute_states(states, 3)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streams_that_ran_dry_in_a_finite_pass_restore(text_val_ds, num_workers):
    """Packing makes per-stream counts data dependent: a stream may end long before the others;
    its snapshot then lags the rank's position legitimately (nothing to replay)."""
    from energon import get_val_dataset
    from tests.task_encoder.test_packing_grouping import TokenPacker

    class UnevenPacker(TokenPacker):
        """Stream 0 (the first val shard) packs 4 samples at a time, stream 1 one by one."""

        def select_samples_to_pack(self, samples):
            if samples[0].__key__.startswith(first_shard):
                return [samples]
            return [[s] for s in samples]

    def loader():
        wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
        dataset = get_val_dataset(
            text_val_ds,
            worker_config=wc,
            batch_size=1,
            packing_buffer_size=4,
            task_encoder=UnevenPacker(400, over_length="split"),
            num_streams=2,
        )
        return get_savable_loader(dataset)

    first_shard = "00003_"
    full = [tuple(b.__key__) for b in loader()]
    assert len(full) == 5 + 20 and sum(k[0].count(",") == 3 for k in full) == 5
    first = loader()
    it = iter(first)
    head = [tuple(next(it).__key__) for _ in range(len(full) - 3)]
    state = first.save_state_rank()
    emitted = {s: snap["emitted"] for s, snap in state["streams"]}
    assert emitted[0] == 5 and emitted[1] == 17  # stream 0 is 11 items behind the position
    again = loader()
    again.restore_state_rank(state)
    assert head + [tuple(b.__key__) for b in again] == full


def _scaled(data, factor, keep=frozenset()):
    """``data`` with every integer multiplied by ``factor`` (but the fields named in ``keep``)."""
    if isinstance(data, dict):
        return {k: v if k in keep else _scaled(v, factor, keep) for k, v in data.items()}
    if isinstance(data, list):
        return [_scaled(v, factor, keep) for v in data]
    if isinstance(data, int) and not isinstance(data, bool):
        return data * factor
    return data


@pytest.mark.parametrize("num_workers", [0, 2])
def test_counters_times_a_trillion_are_refused_with_and_without_workers(text_ds, num_workers):
    """Issue 33: a state whose counters were all multiplied by 10^12 restored silently without
    workers. Every field that must lie in range (stream ids, slice positions and cursors, buffered
    pointers, the layout) is left alone; the counters agree with each other, but a reader cannot
    have handed out more samples than its slice holds in the epochs it has read."""
    loader = make_loader(text_ds, world_size=2, num_workers=2, num_streams=4)
    take(iter(loader), 10)
    state = loader.save_state_rank()
    layout = ("rank", "world_size", "num_streams", "micro_batch_size", "version", "origin")
    bad = {
        k: v if k in layout or k == "fingerprint" else _scaled(v, 10**12) for k, v in state.items()
    }
    bad["streams"] = [
        [stream, _scaled(snap, 10**12, keep={"pos", "active", "buffer", "current"})]
        for stream, snap in state["streams"]
    ]
    assert bad["consumed"] == 10 * 10**12
    again = make_loader(text_ds, world_size=2, num_workers=num_workers, num_streams=4)
    with pytest.raises(StateError, match=r"readers\[0\]\.yielded"):
        again.restore_state_rank(bad)
        next(iter(again))
