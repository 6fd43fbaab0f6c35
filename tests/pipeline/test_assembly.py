"""One assembly of a stream (issue 34, point 2): ``energon.pipeline.assembly.stream_parts`` alone
decides which parts a stream has and in what order, and every path that makes a stream builds what
it lists: the normal executor in training and validation, the balanced executor, the ledger,
``simulate``, the cursor editors and the compat wrappers. The tests insert two probes into its
answer, one on each sample (before packing and batching) and one on each batch (right after
batching), and find both in every path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from energon import (
    Balance,
    BatchDataset,
    GroupBatchDataset,
    MapDataset,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.compat.dataset_config import get_dataset_from_config
from energon.cursor.exclude import exclude_samples
from energon.cursor.skip import skip_steps
from energon.demo.vlm import VlmTaskEncoder, write_vlm_shards
from energon.ledger.ledger import Ledger
from energon.pipeline import assembly
from energon.pipeline.assembly import BATCH_STEP, BATCHING, PACK, POINTERS, SAMPLE, Part
from energon.pipeline.balanced_executor import _hooks_around_packing
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


class Probes:
    def __init__(self) -> None:
        self.sample = Probe()
        self.batch = Probe()


def _with_probes(parts: list[Part], probes: Probes) -> list[Part]:
    """``parts`` with the sample probe before a stream's packing and batching (a compat wrapper's
    list has no sample probe: its samples went through their stream's) and the batch probe
    right after any batching."""
    parts = list(parts)
    kinds = [part.kind for part in parts]
    if kinds[0] == POINTERS:
        ends = [i for i, kind in enumerate(kinds) if kind == PACK or kind in BATCHING]
        parts.insert(ends[0] if ends else len(parts), Part(SAMPLE, "probe", probes.sample))
    batching = [i for i, part in enumerate(parts) if part.kind in BATCHING]
    if batching:
        parts.insert(batching[0] + 1, Part(BATCH_STEP, "batch_probe", probes.batch))
    return parts


@pytest.fixture
def probe(monkeypatch) -> Probes:
    probes = Probes()
    original = assembly.stream_parts
    monkeypatch.setattr(
        assembly, "stream_parts", lambda of, **kw: _with_probes(original(of, **kw), probes)
    )
    return probes


@pytest.fixture(scope="module")
def vlm(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_shards(root, num_samples=40, num_shards=2, seed=3, text_median_chars=100)
    return root


def test_the_probes_run_in_training_and_validation(text_ds, probe):
    batch = next(iter(get_savable_loader(get_train_dataset(text_ds, **TRAIN))))
    assert probe.sample.take() == ["TextSample"] * 4
    assert probe.batch.take() == [type(batch).__name__]
    val = get_val_dataset(text_ds, split_part="train", worker_config=WC, batch_size=4)
    batch = next(iter(get_loader(val)))
    assert probe.sample.take() == ["TextSample"] * 4
    assert probe.batch.take() == [type(batch).__name__]


def test_the_probes_run_in_the_balanced_executor(vlm, probe):
    """The sample probe on each sample of the rank's share, the batch probe on the balanced
    packing's batch, before the task encoder's ``encode_batch``."""
    dataset = get_train_dataset(
        str(vlm),
        **TRAIN,
        num_streams=2,
        task_encoder=VlmTaskEncoder(),
        balance=Balance(max_length=4096, window=2),
    )
    batch = next(iter(get_savable_loader(dataset)))
    assert len(probe.sample.take()) == len(batch.samples) > 0
    assert probe.batch.take() == ["BalancedBatch"]


def test_the_balanced_executor_refuses_a_part_it_cannot_run(vlm):
    spec = get_train_dataset(
        str(vlm), **TRAIN, task_encoder=VlmTaskEncoder(), balance=Balance(max_length=4096)
    ).spec
    parts = assembly.stream_parts(spec)
    assert [p.kind for p in parts] == ["pointers", "load", "sample", "balanced", "batch_step"]
    before, after = _hooks_around_packing(parts)
    assert [p.name for p in before] == ["encode_sample"]
    assert [p.name for p in after] == ["encode_batch"]
    with pytest.raises(ValueError, match="cannot run a 'pack' part"):
        _hooks_around_packing([*parts[:2], Part(PACK), *parts[2:]])


def test_the_probes_run_in_the_ledger_and_simulate(text_ds, probe):
    """The ledger and ``simulate`` run the chain on metadata: the sample probe sees
    :class:`SampleMeta`, the batch probe the simulated batches of it."""
    dataset = get_train_dataset(text_ds, **TRAIN)
    real = [batch.__key__ for batch, _ in zip(get_savable_loader(dataset), range(4))]
    probe.sample.take(), probe.batch.take()
    (record,) = Ledger(dataset).describe_step(3)
    assert [sample.key for output in record.outputs for sample in output] == list(real[3])
    assert set(probe.sample.take()) == {SampleMeta.__name__}
    assert probe.batch.take() == ["list"]  # the described batch: a list of the samples' metadata
    settings = SimulationSettings(world_size=1, num_workers=0, batch_size=4, steps=5)
    simulate(str(text_ds), settings)
    assert set(probe.sample.take()) == {SampleMeta.__name__}
    assert set(probe.batch.take()) == {"list"}


def _resumed_first_batch(text_ds, state):
    loader = get_savable_loader(get_train_dataset(text_ds, **TRAIN))
    loader.restore_state_rank(state)
    return next(iter(loader))


def test_the_probes_are_in_the_streams_the_cursor_editors_write(text_ds, probe):
    """``skip_steps`` and ``exclude_samples`` move the streams through their chains (probes
    included): the states they write restore into a loader with the probes, at the right
    batch."""
    dataset = get_train_dataset(text_ds, **TRAIN)
    loader = get_savable_loader(dataset)
    it = iter(loader)
    next(it)
    state = loader.save_state_rank()
    following = [next(it) for _ in range(3)]
    (moved,), _ = skip_steps([state], 2, dataset=dataset)
    probe.sample.take(), probe.batch.take()
    batch = _resumed_first_batch(text_ds, moved)
    assert batch.__key__ == following[-1].__key__
    assert probe.sample.take() == ["TextSample"] * 4
    assert probe.batch.take() == [type(batch).__name__]
    gone = following[0].__key__[0]
    (edited,), _ = exclude_samples([state], keys=[gone], dataset=dataset)
    batch = _resumed_first_batch(text_ds, edited)
    assert gone not in batch.__key__
    assert probe.sample.take()[:4] == ["TextSample"] * 4
    assert probe.batch.take() == [type(batch).__name__]


def test_the_probes_run_under_the_compat_wrappers(text_ds, probe):
    """A wrapper over a leaf that batches: both probes run in the leaf's stream."""
    leaf = get_train_dataset(text_ds, **TRAIN)
    mapped = MapDataset(leaf, lambda b: b, stateless_map_fn=True, worker_config=WC)
    batch = next(iter(get_savable_loader(mapped)))
    assert probe.sample.take() == ["TextSample"] * 4
    assert probe.batch.take() == [type(batch).__name__]


def _batch_of(samples):
    return {"keys": [s.__key__ for s in samples]}


@pytest.mark.parametrize("wrapper", ["BatchDataset", "GroupBatchDataset"])
def test_the_batch_probe_runs_after_a_batching_wrapper(text_ds, probe, wrapper):
    """A wrapper that batches the samples of an unbatched leaf: the sample probe runs in the
    leaf's stream, the batch probe on the wrapper's batches."""
    leaf = get_dataset_from_config(text_ds, training=True, worker_config=WC).build()
    if wrapper == "BatchDataset":
        batched = BatchDataset(leaf, 3, _batch_of, worker_config=WC)
    else:
        batched = GroupBatchDataset(leaf, None, lambda s: ("all", 3), _batch_of, worker_config=WC)
    loader = get_savable_loader(batched)
    batch = next(iter(loader))
    assert len(batch["keys"]) == 3
    assert probe.sample.take()[:3] == ["TextSample"] * 3
    assert probe.batch.take() == ["dict"]


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
    "sample": ["MapStage"],
    "batch_step": ["MapStage"],
}


@pytest.mark.parametrize(
    "change, tail",
    [
        (dict(), ["batch", "batch_step"]),
        (dict(batch_size=None), []),
        (dict(task_encoder=_Grouping(), batch_size=None), ["group", "batch_step"]),
    ],
)
def test_build_stream_builds_the_parts_stream_parts_lists(text_ds, change, tail):
    spec = get_train_dataset(text_ds, **{**TRAIN, **change}).spec
    parts = assembly.stream_parts(spec)
    kinds = [part.kind for part in parts]
    samples = [kind for kind in kinds if kind == "sample"]
    assert kinds == ["pointers", "load", *samples, *tail]
    expected = []
    for kind in kinds:
        if kind == "pointers":
            expected += [type(s).__name__ for s in build_pointer_stages(spec, 0)]
        else:
            expected += _CLASSES[kind]
    assert [type(s).__name__ for s in build_stream(spec, 0).stages] == expected


def test_a_compat_wrapper_is_one_part_over_its_upstream():
    own = Part("batch", "BatchDataset")
    assert assembly.stream_parts(own) == [Part("upstream"), own]
