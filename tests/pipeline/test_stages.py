"""Each stage saved mid-stream and restored into a freshly built stage over a fresh upstream
continues exactly like the uninterrupted run (in-memory leaves: no files, fast)."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest

from energon.errors import SkipSample
from energon.pipeline.executor import ItemMeta
from energon.pipeline.packing import PackStage
from energon.pipeline.pointers import PointerSource, build_pointer_stages
from energon.pipeline.snapshot import PackedSnapshot, error_state, unpacked
from energon.pipeline.stage import Stage
from energon.pipeline.stages import BatchStage, GroupBatchStage, LoadStage, MapStage
from energon.pipeline.stream import build_stream
from energon.plan.mixing import QuotaSchedule
from energon.plan.reader import SliceReader
from energon.task_encoder import DefaultTaskEncoder
from tests.helpers.stages import (
    MemoryLeaf,
    assert_resumes_exactly,
    counting_policy,
    memory_spec,
    take,
)

SPLITS = range(0, 40, 3)


# -- pointers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        dict(leaves=[MemoryLeaf(37)], shuffle_buffer_size=5),
        dict(
            leaves=[MemoryLeaf(9), MemoryLeaf(23, excluded=[3, 4, 17])],
            mode="weight",
            weights=[0.3, 0.7],
            shuffle_buffer_size=4,
        ),
        dict(leaves=[MemoryLeaf(11), MemoryLeaf(6)], mode="repetitions", repetitions=[2, 0.5]),
        dict(
            leaves=[MemoryLeaf(11), MemoryLeaf(6)],
            mode="repetitions",
            repetitions=[1, 1.5],
            repeat=False,
        ),
        dict(leaves=[MemoryLeaf(13), MemoryLeaf(8)], mode="concat", training=False, repeat=False),
        dict(
            leaves=[MemoryLeaf(3)], training=False, repeat=False, num_streams=4
        ),  # streams without samples
    ],
    ids=[
        "shuffle",
        "weighted",
        "epochized",
        "epochized-once",
        "validation",
        "fewer-samples-than-streams",
    ],
)
def test_pointer_stages_resume_exactly(case):
    spec = memory_spec(**case)
    for stream in range(spec.num_streams):
        assert_resumes_exactly(functools.partial(build_pointer_stages, spec, stream), SPLITS, 60)


def test_the_streams_pointers_cover_the_dataset_once_per_epoch():
    leaf = MemoryLeaf(40, excluded=[5, 6])
    spec = memory_spec([leaf], num_streams=3, shuffle_buffer_size=6)
    for epochs in (1, 2):
        seen = []
        for stream in range(3):
            pointers = build_pointer_stages(spec, stream)[0]
            bounds = pointers.readers[0].bounds
            excluded_here = sum(1 for i in leaf.excluded if bounds[0] <= i < bounds[-1])
            count = epochs * (spec.stream_sample_counts()[stream] - excluded_here)
            seen += [key[2] for key, _ in take(pointers, count)]
        assert sorted(seen) == sorted(epochs * [i for i in range(40) if i not in leaf.excluded])


@pytest.mark.parametrize("mode", ["weight", "repetitions", "concat"])
def test_one_streams_counts_are_that_column_of_all_streams_counts(mode):
    leaves = [MemoryLeaf(n) for n in (37, 5, 101)]
    spec = memory_spec(
        leaves, mode=mode, num_streams=7, weights=[1, 2, 3], repetitions=[1.5, 2, 0.3]
    )
    totals, quotas = spec.stream_sample_counts(), spec.source_stream_quotas()
    for stream in range(7):
        assert spec.stream_sample_count(stream) == totals[stream]
        assert spec.stream_quotas(stream) == [q[stream] for q in quotas]
    per_source = quotas if mode == "repetitions" else spec.source_stream_counts()
    assert totals == [sum(column) for column in zip(*per_source)]


def test_pointer_keys_name_the_kind_of_their_leaf():
    leaves = [MemoryLeaf(4, kind="jsonl"), MemoryLeaf(4, kind="tokens"), MemoryLeaf(4)]
    spec = memory_spec(leaves, mode="concat", training=False, repeat=False, num_streams=1)
    (pointers,) = build_pointer_stages(spec, 0)
    kinds = {key[0]: key[1] for key, _ in take(pointers, 12)}
    assert kinds == {"jsonl": 0, "tokens": 1, "webdataset": 2}


def test_pointer_source_needs_one_kind_per_reader():
    reader = SliceReader(np.array([0, 3]), seed=0, shuffle=False)
    with pytest.raises(ValueError, match="1 readers but 2 source kinds"):
        PointerSource([reader], kinds=["a", "b"])


def test_without_observers_pointer_stages_touch_no_leaf_data():
    class Untouchable(MemoryLeaf):
        def load(self, *args):
            raise AssertionError("pointer stages must not read samples")

        def prefetch(self, *args):
            raise AssertionError("pointer stages must not prefetch without an observer")

    leaf = Untouchable(30)
    leaf.remote = True
    spec = memory_spec([leaf], shuffle_buffer_size=4)
    assert len(take(build_pointer_stages(spec, 0)[-1], 50)) == 50


# -- load ----------------------------------------------------------------------------------------


def _loaded(leaves, spec, policy=None):
    def build():
        stages = build_pointer_stages(spec, 0)
        stages.append(LoadStage(stages[-1], leaves, None, policy or counting_policy("load")))
        return stages

    return build


def test_load_stage_skips_broken_samples_and_keeps_counting_after_restore():
    leaves = [MemoryLeaf(30, broken=[2, 3, 11, 19, 28])]
    spec = memory_spec(leaves, num_streams=1, shuffle_buffer_size=3)
    states = assert_resumes_exactly(_loaded(leaves, spec), SPLITS, 60)
    assert any(s[-1]["skipped"] > 0 for s in states)
    one_pass = memory_spec(leaves, num_streams=1, training=False, repeat=False)
    stages = _loaded(leaves, one_pass)()
    values = [v["n"] for v, _ in take(stages[-1], 100)]
    assert values == [n for n in range(30) if n not in leaves[0].broken]
    assert stages[-1].state()["skipped"] == 5


# -- map -----------------------------------------------------------------------------------------


def _mapped(fn, leaves=None, *, sizes=None):
    leaves = leaves or [MemoryLeaf(25)]
    spec = memory_spec(leaves, num_streams=1, shuffle_buffer_size=4)

    def build():
        stages = _loaded(leaves, spec)()
        stages.append(
            MapStage(stages[-1], fn, "encode_sample", counting_policy(), stream=0, num_streams=1)
        )
        return stages

    return build


def test_map_stage_with_a_plain_hook_and_skips():
    def encode(sample):
        if sample["n"] % 7 == 0:
            raise SkipSample()
        if sample["n"] % 5 == 0:
            raise ValueError("odd one")
        return {**sample, "double": 2 * sample["n"]}

    states = assert_resumes_exactly(_mapped(encode), SPLITS, 50)
    assert any(s[-1]["skipped"] for s in states)


def test_map_stage_with_a_generator_hook_interrupted_between_outputs():
    def encode(sample):
        for part in range(sample["n"] % 4):  # 0 to 3 outputs per input
            if sample["n"] == 13 and part == 1:
                raise SkipSample()  # drops the rest of this input
            yield {"__key__": sample["__key__"], "__restore_key__": (), "part": part}

    states = assert_resumes_exactly(_mapped(encode), range(0, 40), 45)
    pending = [s[-1]["pending"] for s in states if s[-1]["pending"] is not None]
    assert any(emitted > 0 for _, _, emitted in pending), "no split inside a generator"


def test_map_stage_rebuilds_each_output_from_its_key():
    def encode(sample):
        yield from ({"__restore_key__": (), "n": sample["n"], "part": p} for p in range(2))

    stages = _mapped(encode)()
    for value, key in take(stages[-1], 20):
        assert stages[-1].rebuild(key) == value


# -- batch ---------------------------------------------------------------------------------------


def _batched(sizes, *, batcher=lambda values: [v["n"] for v in values], drop_last=False):
    leaves = [MemoryLeaf(23)]
    spec = memory_spec(leaves, num_streams=1, training=False, repeat=False)

    def build():
        stages = _loaded(leaves, spec)()
        stages.append(
            BatchStage(stages[-1], sizes, batcher, counting_policy("batch"), drop_last=drop_last)
        )
        return stages

    return build


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_stage_resumes_and_ends_the_pass(drop_last):
    build = _batched(lambda i: 3 + i % 3, drop_last=drop_last)
    assert_resumes_exactly(build, range(0, 8), 10)
    batches = [value for value, _ in take(build()[-1], 10)]
    assert [len(b) for b in batches] == ([3, 4, 5, 3, 4] if drop_last else [3, 4, 5, 3, 4, 4])


def test_batch_stage_skips_failed_batches_and_rebuilds_the_others():
    def batcher(values):
        if values[0]["n"] == 3:
            raise ValueError("bad batch")
        return [v["n"] for v in values]

    build = _batched(lambda i: 3, batcher=batcher)
    states = assert_resumes_exactly(build, range(0, 8), 10)
    assert states[-1][-1]["skipped"] == 1
    stages = build()
    for value, key in take(stages[-1], 10):
        assert stages[-1].rebuild(key) == value


# -- packing -------------------------------------------------------------------------------------


def _select_in_threes(values):
    ordered = sorted(values, key=lambda v: v["n"])
    return [ordered[i : i + 3] for i in range(0, len(ordered) - 2, 3)]


def _pack_twice(values):
    """A generator packer: two packed samples per group."""
    for half in (0, 1):
        yield {"__restore_key__": (), "members": [v["n"] for v in values], "half": half}


def _packed(pack=_pack_twice):
    leaves = [MemoryLeaf(31)]
    spec = memory_spec(leaves, num_streams=1, shuffle_buffer_size=4)

    def build():
        stages = _loaded(leaves, spec)()
        stages.append(
            PackStage(
                stages[-1],
                7,
                _select_in_threes,
                pack,
                None,
                counting_policy("pack"),
                stream=0,
                num_streams=1,
            )
        )
        return stages

    return build


def test_pack_stage_resumes_with_an_open_generator_packer_and_pending_groups():
    states = assert_resumes_exactly(_packed(), range(0, 30), 32)
    packing = [s[-1] for s in states]
    assert any(p["open"] is not None for p in packing), "no split inside an open packer"
    assert any(p["pending"] for p in packing), "no split with pending groups"
    assert any(p["reading"] for p in packing)


def test_pack_stage_with_a_plain_packer_skips_failed_packs_and_rebuilds_the_others():
    def pack(values):
        members = [v["n"] for v in values]
        if 4 in members:
            raise ValueError("cannot pack")
        return {"__restore_key__": (), "members": members}

    build = _packed(pack)
    states = assert_resumes_exactly(build, range(0, 20, 2), 20)
    assert states[-1][-1]["skipped"] >= 1
    stages = build()
    for value, key in take(stages[-1], 15):
        assert stages[-1].rebuild(key) == value
        assert value["__restore_key__"] == key


# -- grouping ------------------------------------------------------------------------------------


def _grouped(*, max_wait=None, drop_last=False, repeat=True):
    leaves = [MemoryLeaf(40)]
    spec = memory_spec(leaves, num_streams=1, shuffle_buffer_size=5, repeat=repeat, training=repeat)

    def criterion(sample):
        group = sample["n"] % 3
        return ("g", group), 2 + group  # a tuple as group key: saved as a JSON list

    def build():
        stages = _loaded(leaves, spec)()
        stages.append(
            GroupBatchStage(
                stages[-1],
                criterion,
                lambda values: [v["n"] for v in values],
                counting_policy("batch"),
                batch_size=None,
                drop_last=drop_last,
                max_wait=max_wait,
            )
        )
        return stages

    return build


@pytest.mark.parametrize("max_wait", [None, 4])
def test_group_batch_stage_resumes_with_partly_filled_buckets(max_wait):
    states = assert_resumes_exactly(_grouped(max_wait=max_wait), range(0, 25), 30)
    assert any(s[-1]["buckets"] for s in states), "no split with a partly filled bucket"
    stages = _grouped(max_wait=max_wait)()
    for value, key in take(stages[-1], 20):
        assert stages[-1].rebuild(key) == value


def test_group_batch_stage_flushes_or_drops_partial_buckets_at_the_end_of_a_pass():
    kept = [v for v, _ in take(_grouped(repeat=False)()[-1], 100)]
    dropped = [v for v, _ in take(_grouped(repeat=False, drop_last=True)()[-1], 100)]
    assert sorted(n for batch in kept for n in batch) == list(range(40))
    assert len(dropped) < len(kept)
    assert_resumes_exactly(_grouped(repeat=False), range(0, 20, 2), 100)


# -- a whole stream ------------------------------------------------------------------------------


class _Encoder(DefaultTaskEncoder):
    def encode_sample(self, sample):
        for part in range(1 + sample["n"] % 2):
            yield {**sample, "part": part}

    def batch(self, samples):
        return [(s["n"], s["part"]) for s in samples]

    def encode_batch(self, batch):
        return {"__restore_key__": (), "items": batch, "index": self.current_batch_index}


def test_a_stream_resumes_from_its_snapshot():
    spec = memory_spec(
        [MemoryLeaf(17), MemoryLeaf(12)],
        mode="weight",
        weights=[2, 1],
        task_encoder=_Encoder(),
        batch_size=3,
        shuffle_buffer_size=4,
    )

    def build():
        stream = build_stream(spec, 1)
        return [stream]

    snapshots = assert_resumes_exactly(build, range(0, 12), 14)
    emitted = [s[0]["emitted"] for s in snapshots]
    assert emitted == list(range(0, 12))
    stream = build()[0]
    for value, key in take(stream, 5):
        assert stream.rebuild(key)["items"] == value["items"]


# -- the contract --------------------------------------------------------------------------------


def test_a_stage_missing_a_method_fails_at_construction():
    class Forgetful(Stage):
        def next(self):
            return None, ()

        def state(self):
            return {}

        def restore(self, state):
            pass

    with pytest.raises(TypeError, match="rebuild"):
        Forgetful()


def test_every_stage_keeps_the_contract():
    for cls in (PointerSource, LoadStage, MapStage, BatchStage, PackStage, GroupBatchStage):
        assert issubclass(cls, Stage) and not cls.__abstractmethods__


def test_stages_iterate_like_python_iterators():
    spec = memory_spec([MemoryLeaf(5)], training=False, repeat=False, num_streams=1)
    (pointers,) = build_pointer_stages(spec, 0)
    assert [key[2] for key, _ in pointers] == [0, 1, 2, 3, 4]


def test_item_meta_survives_pickling_and_stays_small():
    snapshot = {"emitted": 3, "stages": [{"batches": 3}]}
    meta = ItemMeta(position=12, stream=1, snapshot=snapshot)
    again = pickle.loads(pickle.dumps(meta))
    assert again == meta and again.arena is False
    # the snapshot travels packed: unpacked when the main process reads it, its error account
    # readable without unpacking
    assert isinstance(again.snapshot, PackedSnapshot)
    assert unpacked(again.snapshot) == snapshot and error_state(again.snapshot) is None
    overhead = len(pickle.dumps(meta)) - len(pickle.dumps(snapshot))
    assert overhead < 200
    with pytest.raises(AttributeError):
        meta.extra = 1  # slots: no per-item __dict__


def test_quota_schedule_drives_a_pointer_source():
    readers = [SliceReader(np.array([0, 4]), seed=i, shuffle=False) for i in (0, 1)]
    source = PointerSource(readers, QuotaSchedule([2, 1]), kinds=["a", "b"], repeat=False)
    assert [key for key, _ in source] == [("a", 0, 0), ("b", 1, 0), ("a", 0, 1)]
