"""One assembly of a stream (issue 34, point 2): a step added to
``energon.pipeline.assembly.sample_steps`` runs in every path that builds a stream: the normal
executor in training and validation, the balanced executor, the ledger, ``simulate``, the cursor
editors and the compat wrappers. The test adds a probe step that records what passes through it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from energon import (
    Balance,
    MapDataset,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.compat.dataset_config import get_dataset_from_config
from energon.cursor.skip import skip_steps
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.ledger.ledger import Ledger
from energon.pipeline import assembly
from energon.pipeline.assembly import SampleStep
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.stream import build_stream
from energon.preflight.simulate import SimulationSettings, simulate
from energon.source.meta import SampleMeta
from energon.task_encoder import DefaultTaskEncoder

WC = WorkerConfig(rank=0, world_size=1, num_workers=0)
TRAIN = dict(worker_config=WC, batch_size=4, shuffle_buffer_size=8, max_samples_per_sequence=5)


class Probe:
    """Records the type of every value that passes through it; passes it on unchanged."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, value):
        self.seen.append(type(value).__name__)
        return value

    def take(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


@pytest.fixture
def probe(monkeypatch) -> Probe:
    probe = Probe()
    original = assembly.sample_steps

    def with_probe(spec, **kwargs):
        return [*original(spec, **kwargs), SampleStep("probe", probe)]

    monkeypatch.setattr(assembly, "sample_steps", with_probe)
    return probe


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_shards(root, num_samples=40, num_shards=2, seed=3, text_median_chars=100)
    return root


def test_the_probe_runs_in_training_and_validation(text_ds, probe):
    next(iter(get_savable_loader(get_train_dataset(text_ds, **TRAIN))))
    assert probe.take() == ["TextSample"] * 4
    val = get_val_dataset(text_ds, split_part="train", worker_config=WC, batch_size=4)
    next(iter(get_loader(val)))
    assert probe.take() == ["TextSample"] * 4


def test_the_probe_runs_in_the_balanced_executor(vlm, probe):
    dataset = get_train_dataset(
        str(vlm),
        **TRAIN,
        num_streams=2,
        task_encoder=VlmTaskEncoder(),
        balance=Balance(max_length=4096, window=2),
    )
    batch = next(iter(get_savable_loader(dataset)))
    assert len(probe.take()) == len(batch.samples) > 0


def test_the_probe_runs_in_the_ledger_and_simulate(text_ds, probe):
    Ledger(get_train_dataset(text_ds, **TRAIN)).describe_step(3)
    assert set(probe.take()) == {SampleMeta.__name__}  # the ledger runs the chain on metadata
    settings = SimulationSettings(world_size=1, num_workers=0, batch_size=4, steps=5)
    simulate(str(text_ds), settings)
    assert set(probe.take()) == {SampleMeta.__name__}


def test_the_probe_is_in_the_streams_the_cursor_editors_write(text_ds, probe):
    """``skip_steps`` moves the streams through their chains (probe included): the state it
    writes restores into a loader with the probe, at the batch three steps on."""
    dataset = get_train_dataset(text_ds, **TRAIN)
    loader = get_savable_loader(dataset)
    it = iter(loader)
    next(it)
    state = loader.save_state_rank()
    expected = [next(it) for _ in range(3)][-1]
    (moved,), _ = skip_steps([state], 2, dataset=dataset)
    resumed = get_savable_loader(get_train_dataset(text_ds, **TRAIN))
    resumed.restore_state_rank(moved)
    probe.take()
    assert next(iter(resumed)).__key__ == expected.__key__
    assert probe.take() == ["TextSample"] * 4


def test_the_probe_runs_under_the_compat_wrappers(text_ds, probe):
    factory = get_dataset_from_config(text_ds, training=True, worker_config=WC)
    mapped = MapDataset(factory.build(), lambda s: s, stateless_map_fn=True, worker_config=WC)
    next(iter(get_savable_loader(mapped)))
    assert probe.take()[:1] == ["TextSample"]


class _Grouping(DefaultTaskEncoder):
    def batch_group_criterion(self, sample):
        return ("all", 3)

    def encode_batch(self, batch):
        return batch


_CLASSES = {
    "load": ["LoadStage"],
    "pack": ["PackStage"],
    "group": ["GroupBatchStage"],
    "batch": ["BatchStage"],
    "encode_batch": ["MapStage"],
}


@pytest.mark.parametrize(
    "change, tail",
    [
        (dict(), ["batch", "encode_batch"]),
        (dict(batch_size=None), []),
        (dict(task_encoder=_Grouping(), batch_size=None), ["group", "encode_batch"]),
    ],
)
def test_build_stream_builds_the_parts_stream_parts_lists(text_ds, change, tail):
    spec = get_train_dataset(text_ds, **{**TRAIN, **change}).spec
    parts = assembly.stream_parts(spec)
    assert parts == ["pointers", "load", "samples", *tail]
    expected = []
    for part in parts:
        if part == "pointers":
            expected += [type(s).__name__ for s in build_pointer_stages(spec, 0)]
        elif part == "samples":
            expected += ["MapStage"] * len(assembly.sample_steps(spec))
        else:
            expected += _CLASSES[part]
    assert [type(s).__name__ for s in build_stream(spec, 0).stages] == expected
