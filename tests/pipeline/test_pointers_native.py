"""The C pointer stepper is bit-identical to the Python pointer stages: the same pointers in the same
order and the same stage states afterwards, for random configurations, chunkings and states."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energon.pipeline import pointers_native as native
from energon.pipeline.keys import pointer_target
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.pointers_native import NativePointers
from energon.plan.edits import Exclusion, PlanEdits
from tests.helpers.stages import MemoryLeaf, memory_spec

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler on this machine")


@st.composite
def configs(draw):
    n_sources = draw(st.integers(1, 3))
    leaves = []
    num_streams = draw(st.integers(1, 4))
    for i in range(n_sources):
        size = draw(st.integers(1, 120))
        # never a whole stream range excluded: the stages would search forever (as the loader)
        excluded = draw(st.lists(st.integers(0, size - 1), max_size=1)) if size >= 20 else []
        leaves.append(
            MemoryLeaf(
                size,
                name=f"leaf{i}",
                shard_size=draw(st.integers(1, 40)),
                excluded=excluded,
            )
        )
    mode = draw(st.sampled_from(["weight", "repetitions"])) if n_sources > 1 else "none"
    weights = [draw(st.floats(0.05, 1.0)) for _ in leaves]
    repetitions = [draw(st.sampled_from([0.5, 1, 1.5, 2, 3])) for _ in leaves]
    spec = memory_spec(
        leaves,
        mode=mode,
        weights=weights,
        repetitions=repetitions,
        num_streams=num_streams,
        shuffle_buffer_size=draw(st.sampled_from([None, 2, 7, 50])),
        max_samples_per_sequence=draw(st.sampled_from([None, 1, 3, 10])),
        parallel_shard_iters=draw(st.sampled_from([None, 1, 2, 5])),
    )
    over_epochs = draw(st.sampled_from([1, 2, -1, None]))
    if over_epochs is None:
        spec = dataclasses.replace(spec, parallel_shard_iters=1)
    spec.sources = [dataclasses.replace(s, shuffle_over_epochs=over_epochs) for s in spec.sources]
    if draw(st.booleans()) and len(leaves[0]) >= 4 * num_streams:
        leaf = leaves[0]
        a = draw(st.integers(0, len(leaf) - 2))
        b = a + draw(st.integers(1, 2))
        spec.edits = PlanEdits(exclude=(Exclusion(leaf.root, leaf.split_part, ((a, b),)),))
    return spec


def _python_run(stages, count):
    return [pointer_target(stages[-1].next()[1]) for _ in range(count)]


def _states(stages):
    return json.loads(json.dumps([s.state() for s in stages]))


@settings(max_examples=150, deadline=None)
@given(
    spec=configs(),
    chunks=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    stream=st.integers(0, 3),
)
def test_native_stepper_matches_the_python_stages(spec, chunks, stream):
    stream %= spec.num_streams
    if spec.stream_sample_counts()[stream] == 0:
        return  # a training stream without samples (get_train_dataset refuses those)
    python = build_pointer_stages(spec, stream)
    fast = build_pointer_stages(spec, stream)
    for count in chunks:
        expected = _python_run(python, count)
        stepper = NativePointers.attach(fast)
        assert stepper is not None
        sources, indices = stepper.advance(count, keep_from=0)
        stepper.write_back()
        assert list(zip(sources.tolist(), indices.tolist())) == expected
        assert _states(fast) == _states(python)


def test_counts_and_kept_window():
    leaves = [MemoryLeaf(500, name="a", shard_size=37), MemoryLeaf(200, name="b", shard_size=50)]
    spec = memory_spec(
        leaves, mode="weight", weights=[0.7, 0.3], num_streams=3, shuffle_buffer_size=20
    )
    python = build_pointer_stages(spec, 1)
    expected = _python_run(python, 3000)
    fast = build_pointer_stages(spec, 1)
    counts = [np.zeros(500, dtype=np.uint32), np.zeros(200, dtype=np.uint32)]
    stepper = NativePointers.attach(fast)
    sources, indices = stepper.advance(3000, keep_from=2990, counts=counts)
    assert list(zip(sources.tolist(), indices.tolist())) == expected[2990:]
    for source in (0, 1):
        wanted = np.bincount([i for s, i in expected if s == source], minlength=len(counts[source]))
        assert np.array_equal(counts[source], wanted)


def test_native_can_be_disabled(monkeypatch):
    monkeypatch.setenv("ENERGON_NO_NATIVE", "1")
    spec = memory_spec([MemoryLeaf(50)], num_streams=1)
    assert NativePointers.attach(build_pointer_stages(spec, 0)) is None


def test_finite_passes_and_other_stages_use_python():
    val = memory_spec([MemoryLeaf(50)], training=False, repeat=False, num_streams=1)
    assert NativePointers.attach(build_pointer_stages(val, 0)) is None
    train = memory_spec([MemoryLeaf(50)], num_streams=1, shuffle_buffer_size=4)
    stages = build_pointer_stages(train, 0)
    assert NativePointers.attach(stages) is not None
    assert NativePointers.attach([stages[1]]) is None  # not starting with the pointer source


def test_stages_with_state_the_c_copy_does_not_know_use_python(monkeypatch):
    from energon.pipeline.pointers import PointerSource

    spec = memory_spec([MemoryLeaf(50), MemoryLeaf(30)], mode="weight", num_streams=1)
    assert NativePointers.attach(build_pointer_stages(spec, 0)) is not None
    original = PointerSource.state
    monkeypatch.setattr(PointerSource, "state", lambda self: {**original(self), "step": 3})
    assert NativePointers.attach(build_pointer_stages(spec, 0)) is None
