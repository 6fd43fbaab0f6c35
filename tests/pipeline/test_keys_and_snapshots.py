"""Restore keys and stream snapshots: their shapes, their JSON round trip, their accessors."""

from __future__ import annotations

import json

import pytest

from energon.pipeline import keys, snapshot
from energon.pipeline.stream import build_stream
from tests.helpers.stages import MemoryLeaf, memory_spec, take


def test_every_key_shape_survives_json():
    pointer = keys.pointer_key("jsonl", 1, 42)
    mapped = keys.map_key("encode_sample", 9, 2, pointer, 4)
    packed = keys.pack_key(3, 1, (mapped, keys.pointer_key("tokens", 0, 7)))
    batch = keys.batch_key(5, (packed, mapped))
    loader_key = keys.stream_key(2, 6, batch)
    again = keys.as_key(json.loads(json.dumps(loader_key)))
    assert again == loader_key
    assert keys.parse_stream_key(json.loads(json.dumps(loader_key))) == (2, 6, batch)
    assert keys.pointer_target(pointer) == (1, 42)
    assert keys.map_parts(mapped) == (9, 2, pointer, 4)
    assert keys.pack_parts(packed) == (3, 1, (mapped, ("tokens", 0, 7)))
    assert keys.batch_members(batch) == (packed, mapped)


@pytest.mark.parametrize(
    "bad",
    [
        ("Batch", 0, ()),
        ["Stream", "1", []],
        ("Stream", 1),
        "Stream",
        None,
        ("Stream", 0, 5),
        ("Stream", 0, ("Batch", 0, ())),
    ],
)
def test_parse_stream_key_rejects_other_data(bad):
    with pytest.raises(ValueError, match="not a restore key of this loader"):
        keys.parse_stream_key(bad)


def test_legacy_pointers_get_the_kind_of_their_source():
    legacy = {
        "buffer": [["Webdataset", 0, 5], ["Webdataset", 1, 2]],
        "pending": [["Map", "encode_sample", 3, 0, ["Webdataset", 1, 9]], 3, 1],
        "rng": 4,
        "group": ["Webdataset", "x", 1],  # not a pointer: left alone
    }
    retagged = keys.retag_legacy_pointers(legacy, ["webdataset", "jsonl"])
    assert retagged == {
        "buffer": [["webdataset", 0, 5], ["jsonl", 1, 2]],
        "pending": [["Map", "encode_sample", 3, 0, ["jsonl", 1, 9]], 3, 1],
        "rng": 4,
        "group": ["Webdataset", "x", 1],
    }


def test_attach_restore_key_only_where_the_value_has_one():
    sample = {"__restore_key__": (), "x": 1}
    plain = {"x": 1}
    keys.attach_restore_key(sample, ("k",))
    keys.attach_restore_key(plain, ("k",))
    keys.attach_restore_key([1, 2], ("k",))
    assert sample["__restore_key__"] == ("k",) and "__restore_key__" not in plain


def test_snapshot_accessors_read_what_the_stream_saved():
    leaves = [MemoryLeaf(20), MemoryLeaf(10)]
    spec = memory_spec(leaves, mode="weight", weights=[1, 1], batch_size=4, num_streams=1)
    stream = build_stream(spec, 0)
    take(stream, 5)  # 20 samples: 10 of each source
    snap = json.loads(json.dumps(stream.state()))
    assert snapshot.emitted(snap) == 5
    assert snapshot.samples_read(snap) == [10, 10]
    assert snapshot.reader_epochs(snap) == [0, 0]
    take(stream, 3)  # 12 more: the second source starts its second epoch
    later = stream.state()
    assert snapshot.reader_epochs(later) == [0, 1]
    assert snapshot.latest([snap, later, snap]) is later
    assert len(snapshot.stage_states(later)) == len(stream.stages)
    assert snapshot.pointer_state(later)["schedule"]["picks"] == 32
