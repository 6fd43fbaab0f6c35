"""Loader objects do not interfere, parts decode to the same types with and without workers, and
every WorkerConfig field that is accepted is used (issue 14, point 10)."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tarfile

import numpy as np
import pytest

from energon import (
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from energon.prepare.dataset import prepare_dataset
from tests.helpers.ref_venv import OUR_PYTHON, ref_python, run_script  # noqa: F401


def train_loader(dataset):
    return get_savable_loader(dataset)


def keys(loader, count):
    it = iter(loader)
    return [tuple(next(it).__key__) for _ in range(count)]


def test_restoring_one_loader_leaves_another_over_the_same_dataset_alone(text_ds):
    """A state saved with 4 logical streams restored into loader A (whose dataset defaults to 2)
    changes A's streams, not the dataset's or loader B's."""
    options = dict(batch_size=2, shuffle_buffer_size=5, max_samples_per_sequence=4)
    wc2 = WorkerConfig(rank=0, world_size=1, num_workers=2)
    wc4 = WorkerConfig(rank=0, world_size=1, num_workers=4)
    saver = train_loader(get_train_dataset(text_ds, worker_config=wc4, **options))
    keys(saver, 3)
    state = saver.save_state_rank()

    dataset = get_train_dataset(text_ds, worker_config=wc2, **options)
    expected_b = keys(train_loader(get_train_dataset(text_ds, worker_config=wc2, **options)), 6)
    a = train_loader(dataset)
    b = train_loader(dataset)
    a.restore_state_rank(state)
    assert dataset.spec.num_streams == 2
    keys(a, 2)
    assert keys(b, 6) == expected_b
    assert a.save_state_rank()["num_streams"] == 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_loaders_over_one_dataset_keep_their_own_positions(text_ds, num_workers):
    wc = WorkerConfig(rank=0, world_size=1, num_workers=num_workers)
    options = dict(batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=5)
    dataset = get_train_dataset(text_ds, worker_config=wc, **options)
    fresh = keys(train_loader(get_train_dataset(text_ds, worker_config=wc, **options)), 8)
    a = train_loader(dataset)
    it_a = iter(a)
    head = [tuple(next(it_a).__key__) for _ in range(5)]
    state = a.save_state_rank()
    b = train_loader(dataset)
    b.restore_state_rank(state)
    c = train_loader(dataset)
    assert keys(c, 8) == fresh, "a new loader starts at the beginning"
    assert keys(b, 3) == fresh[5:8]
    assert head + [tuple(next(it_a).__key__) for _ in range(3)] == fresh


# -- part types ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def npy_ds(tmp_path_factory):
    """8 samples of a .npy array and a .txt part, a crude dataset prepared by energon."""
    root = tmp_path_factory.mktemp("npy")
    with tarfile.open(root / "shard0.tar", "w") as tar:
        for i in range(8):
            buf = io.BytesIO()
            np.save(buf, np.arange(3, dtype=np.float32) + i)
            for name, data in ((f"s{i:03d}.npy", buf.getvalue()), (f"s{i:03d}.txt", b"t")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(
        "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
    )
    return root


TYPES_SCRIPT = """
import dataclasses, json, sys
# energon: alias
from megatron.energon import (Cooker, DefaultTaskEncoder, Sample, WorkerConfig, basic_sample_keys,
    get_loader, get_val_dataset, stateless)

@dataclasses.dataclass
class NpySample(Sample):
    npy: object
    txt: str

@stateless
def cook(crude):
    return NpySample(**basic_sample_keys(crude), npy=crude["npy"], txt=crude["txt"])

class Typed(DefaultTaskEncoder):
    cookers = [Cooker(cook)]

class Dicts(Typed):
    def encode_sample(self, s):
        return {"__key__": s.__key__, "npy": s.npy, "pair": (1, s.npy), "nested": [s.npy]}

def describe(value):
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *[describe(v) for v in value[:2]]]
    return type(value).__name__

out = {}
for encoder in (Typed, Dicts):
    for workers in (0, 2):
        for batch_size in (None, 2):
            wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
            ds = get_val_dataset(sys.argv[1], worker_config=wc, batch_size=batch_size, split_part="train",
                                 task_encoder=encoder())
            item = next(iter(get_loader(ds)))
            fields = item if isinstance(item, dict) else {
                f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
            out[f"{encoder.__name__} workers={workers} batch={batch_size}"] = {
                name: describe(fields[name]) for name in ("npy", "pair", "nested") if name in fields}
print(json.dumps(out, sort_keys=True))
"""


def _types(python, npy_ds):
    return json.loads(run_script(python, TYPES_SCRIPT, str(npy_ds)).strip().splitlines()[-1])


def test_parts_have_the_same_types_with_and_without_workers(npy_ds):
    types = _types(OUR_PYTHON, npy_ds)
    for encoder in ("Typed", "Dicts"):
        for batch in ("None", "2"):
            assert (
                types[f"{encoder} workers=0 batch={batch}"]
                == types[f"{encoder} workers=2 batch={batch}"]
            )
    assert types["Dicts workers=0 batch=None"]["npy"] == "Tensor"
    assert types["Typed workers=0 batch=None"]["npy"] == "ndarray"


@pytest.mark.compat
def test_part_types_are_megatron_energons(ref_python, npy_ds):  # noqa: F811
    """torch's default_convert on dicts, lists and tuples (not dataclasses), with 0 and 2 workers."""
    assert _types(OUR_PYTHON, npy_ds) == _types(ref_python, npy_ds)


# -- WorkerConfig ------------------------------------------------------------------------------------

SIGNATURE_SCRIPT = """
import inspect, json
# energon: alias
from megatron.energon import WorkerConfig
print(json.dumps(list(inspect.signature(WorkerConfig).parameters)))
"""


@pytest.mark.compat
def test_worker_config_takes_megatron_energons_fields(ref_python):  # noqa: F811
    ours = json.loads(run_script(OUR_PYTHON, SIGNATURE_SCRIPT).strip().splitlines()[-1])
    assert ours == json.loads(run_script(ref_python, SIGNATURE_SCRIPT).strip().splitlines()[-1])


def test_every_worker_config_field_is_used(text_ds, tmp_path):
    """Fields are listed here with the behaviour that uses them; a new field needs a line."""
    uses = {
        "rank": "which positions the rank consumes",
        "world_size": "how many ranks share the sequence",
        "num_workers": "loader worker processes",
        "data_parallel_group": "save/restore_state_global, validation agreement",
        "seed_offset": "the data order",
        "worker_debug_path": "debug log files",
        "worker_log_level": "debug log level",
        "_worker_debug_file": "debug log lines of one process (tested below)",
        "_worker_debug_file_worker_id": "which process writes to _worker_debug_file",
        "global_error_handler": "every skipped sample",
        "restore_error_handler": "errors of restore_sample",
    }
    assert [f.name for f in dataclasses.fields(WorkerConfig)] == list(uses)
    assert "prefetch_factor" not in inspect.signature(WorkerConfig).parameters

    log = io.StringIO()
    wc = WorkerConfig(
        rank=0,
        world_size=1,
        num_workers=0,
        worker_log_level=1,
        worker_debug_path=str(tmp_path / "never-{worker_id}.jsonl"),
        _worker_debug_file=log,
        _worker_debug_file_worker_id=0,  # the main process of rank 0
    )
    loader = get_loader(
        get_val_dataset(text_ds, worker_config=wc, batch_size=4, split_part="train")
    )
    next(iter(loader))
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert any(r["t"].endswith(".yield") for r in records)
    assert not list(tmp_path.iterdir()), "the given file replaces the path for this process"


@pytest.mark.parametrize("watchdog", [60, None])
def test_a_dropped_loader_ends_its_workers(text_ds, watchdog):
    """A loader its user drops mid-pass (an evaluation loader made per eval, say) must not keep
    its worker processes: the watchdog's thread outlives the loader and must not hold it."""
    import gc
    import os
    import threading
    import time

    threads_before = threading.active_count()
    children_before = _children()
    dataset = get_train_dataset(
        text_ds,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2),
        batch_size=4,
        shuffle_buffer_size=4,
        max_samples_per_sequence=5,
    )
    loader = get_savable_loader(dataset, watchdog_timeout_seconds=watchdog)
    it = iter(loader)
    next(it)
    pids = sorted(_children() - children_before)  # the workers this loader started
    assert len(pids) == 2
    del it, loader, dataset
    gc.collect()
    alive = pids
    for _ in range(600):  # torch joins its workers on shutdown; allow 60 s on a busy machine
        alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}")]
        if not alive:
            break
        time.sleep(0.1)
    assert alive == [], "the dropped loader's workers are still running"
    for _ in range(600):  # the watchdog's thread ends with its loader
        if threading.active_count() <= threads_before:
            break
        time.sleep(0.1)
    assert threading.active_count() <= threads_before


def _children() -> set[int]:
    """The pids of this process's child processes (from /proc)."""
    import os

    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                found.add(int(entry))
    return found
