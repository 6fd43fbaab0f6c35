"""Contracts of docs/internals-contracts.md about stages, specs and the plan, checked by what
the code does: a stage that misses a method fails when it is constructed; ``next_items(n)`` gives
what ``n`` calls of ``next()`` give and leaves the same state; a spec and its leaves pickle
without open files after reading; the pointer stages (the plan) read no file; ``import energon``
imports no part of the library until a name is used."""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle

import pytest

from energon import WorkerConfig, get_savable_loader, get_train_dataset
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.stage import Stage
from energon.pipeline.stream import build_stream
from tests.helpers.modules import run_fresh

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)


def test_a_stage_that_misses_a_method_fails_when_constructed():
    class NoRebuild(Stage):
        def next(self):
            raise StopIteration

        def state(self):
            return {}

        def restore(self, state):
            pass

    with pytest.raises(TypeError, match="rebuild"):
        NoRebuild()


@pytest.mark.parametrize("dataset", ["text_ds", "captioning_ds"])
def test_next_items_gives_what_next_gives_and_the_same_state(request, dataset):
    """The stage a batch asks its items of (the load stage, or an identity map over it): with
    decode threads for images."""
    path = request.getfixturevalue(dataset)
    spec = get_train_dataset(
        path,
        worker_config=WC,
        batch_size=4,
        shuffle_buffer_size=8,
        max_samples_per_sequence=None,
        decode_threads=2,
    ).spec
    together, one_by_one = build_stream(spec, 0), build_stream(spec, 0)
    feeding = len(together.stages) - 2  # the stage before the batch stage
    for _ in range(3):
        items = together.stages[feeding].next_items(4)
        singles = [one_by_one.stages[feeding].next() for _ in range(4)]
        assert [key for _, key in items] == [key for _, key in singles]
        assert json.dumps(together.state()) == json.dumps(one_by_one.state())


def test_a_spec_and_its_leaves_pickle_without_open_files_after_reading(text_ds):
    dataset = get_train_dataset(
        text_ds,
        worker_config=WC,
        batch_size=4,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    loader = get_savable_loader(dataset)
    it = iter(loader)
    for _ in range(5):
        next(it)
    data = pickle.dumps(dataset.spec)  # an open file would not pickle
    assert len(data) < 200_000
    leaf = dataset.spec.leaves[0]
    leaf.load(3, None, ("webdataset", 0, 3))
    again = pickle.loads(pickle.dumps(leaf))
    assert (
        again.load(3, None, ("webdataset", 0, 3)).__key__
        == leaf.load(3, None, ("webdataset", 0, 3)).__key__
    )


def test_the_pointer_stages_read_no_file(text_ds, monkeypatch):
    """The plan is arithmetic over counts: once the leaves are open, running the pointer stages
    (what a ledger or a simulation runs) opens no file."""
    spec = get_train_dataset(
        text_ds, worker_config=WC, batch_size=4, shuffle_buffer_size=16, max_samples_per_sequence=3
    ).spec
    build_pointer_stages(spec, 0)[-1].next()  # opens what the leaves open once

    def refuse(*args, **kwargs):
        raise AssertionError(f"the plan opened a file: {args[:1]}")

    for module, name in [(builtins, "open"), (io, "open"), (os, "open")]:
        monkeypatch.setattr(module, name, refuse)
    sink = build_pointer_stages(spec, 0)[-1]
    pointers = [sink.next()[1] for _ in range(300)]  # past the 120 samples: a second epoch
    assert {index for _, _, index in pointers} == set(range(120))


def test_import_energon_imports_no_part_of_the_library_until_a_name_is_used():
    """``energon/__init__.py`` only re-exports, lazily."""
    proc = run_fresh(
        "import json, sys\n"
        "import energon\n"
        "before = sorted(m for m in sys.modules if m.startswith('energon.'))\n"
        "energon.get_train_dataset\n"
        "after = 'energon.loader.build' in sys.modules\n"
        "print(json.dumps([before, after]))\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after = json.loads(proc.stdout)
    assert not [m for m in before if m.split(".")[1] in ("loader", "pipeline", "source", "plan")]
    assert after
