"""Behaviour that code written for Megatron-Energon relies on, checked side by side: the same script
runs on the reference (megatron-energon 7.x in its side venv) and on energon (through the alias).

Covers ``restore_sample``'s sample/batch indices, the loaders' and wrappers' parameters, the
deprecated state methods and loader ids, the per-worker debug logs and ``energon analyze-debug``.
"""

from __future__ import annotations

import inspect
import json
import os
import re

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from energon.cli.main import cli
from tests.helpers.datasets import make_text_dataset
from tests.helpers.ref_venv import OUR_PYTHON, ref_cli, run_script

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def text50(tmp_path_factory):
    """50 text samples in 2 shards (keys 00000_0000NN, 00001_0000NN), prepared by energon."""
    return make_text_dataset(tmp_path_factory.mktemp("text50"), num_samples=50, num_shards=2)


def both(ref_python, script: str, *args: str) -> tuple[str, str]:
    return run_script(ref_python, script, *args), run_script(OUR_PYTHON, script, *args)


# ---- restore_sample re-creates the indices the hooks saw -----------------------------------

RESTORE_SCRIPT = """
import json, sys
from dataclasses import dataclass
# energon: alias
from megatron.energon import (Batch, DefaultTaskEncoder, Sample, WorkerConfig, get_loader,
    get_train_dataset, stateless)

@dataclass
class S(Sample):
    si: int
    bi: int

@dataclass
class B(Batch):
    keys: list
    si: list
    bi: list
    batch_bi: int
    batch_si: int
    enc_bi: int = -1
    enc_si: int = -1

class TE(DefaultTaskEncoder):
    @stateless
    def encode_sample(self, s):
        return S.derive_from(s, si=self.current_sample_index, bi=self.current_batch_index)

    @stateless
    def batch(self, samples):
        return B.derive_from(samples[0], keys=[s.__key__ for s in samples], si=[s.si for s in samples],
            bi=[s.bi for s in samples], batch_bi=self.current_batch_index,
            batch_si=self.current_sample_index)

    @stateless
    def encode_batch(self, b):
        b.enc_bi, b.enc_si = self.current_batch_index, self.current_sample_index
        return b

def row(b):
    return [b.keys, b.si, b.bi, b.batch_bi, b.batch_si, b.enc_bi, b.enc_si]

wc = WorkerConfig(rank=0, world_size=1, num_workers=int(sys.argv[2]))
loader = get_loader(get_train_dataset(sys.argv[1], batch_size=2, worker_config=wc, task_encoder=TE(),
    shuffle_buffer_size=None, max_samples_per_sequence=None))
batches = []
for b in loader:
    batches.append(b)
    if len(batches) == 6:
        break
# restored later, in another order: each must come back as it was, not with the latest index
restored = [loader.restore_sample(b.__restore_key__) for b in reversed(batches)][::-1]
print(json.dumps({"yielded": [row(b) for b in batches], "restored": [row(b) for b in restored]}))
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_restore_sample_recreates_sample_and_batch_indices(ref_python, text50, num_workers):
    theirs, ours = (
        json.loads(out.splitlines()[-1])
        for out in both(ref_python, RESTORE_SCRIPT, str(text50), str(num_workers))
    )
    for result in (theirs, ours):
        assert result["restored"] == result["yielded"]
    # the indices follow the reference's numbering (one rank: stream = worker)
    assert [r[1:] for r in ours["yielded"]] == [r[1:] for r in theirs["yielded"]]
    if num_workers == 2:  # and with 2 workers the very same samples
        assert ours["yielded"] == theirs["yielded"]


# ---- parameters of the loaders and wrappers --------------------------------------------------

SIGNATURE_SCRIPT = """
import inspect, json
# energon: alias
import megatron.energon as me
out = {}
for name in ("get_loader", "get_savable_loader", "LimitDataset", "RepeatDataset", "get_val_datasets",
             "get_val_dataset", "get_train_dataset"):
    params = inspect.signature(getattr(me, name)).parameters.values()
    out[name] = [[p.name, str(p.kind), None if p.default is p.empty or p.name == "task_encoder"
                  else repr(p.default)] for p in params]
print(json.dumps(out))
"""


def test_loader_and_wrapper_parameters_are_the_references(ref_python):
    """The reference's parameters, in its order, kinds and defaults; energon's own options are
    extra keyword-only parameters with defaults (calls written for the reference are unchanged)."""
    theirs, ours = (json.loads(out.splitlines()[-1]) for out in both(ref_python, SIGNATURE_SCRIPT))
    assert sorted(ours) == sorted(theirs)
    for name, reference in theirs.items():
        known = {p[0] for p in reference}
        extra = [p for p in ours[name] if p[0] not in known]
        assert [p for p in ours[name] if p[0] in known] == reference, name
        assert all(kind == "KEYWORD_ONLY" and default is not None for _, kind, default in extra)


@pytest.mark.parametrize(
    "call",
    [
        "get_loader(ds, prefetch_factr=2)",
        "get_savable_loader(ds, checkpoint_every_secs=1)",
        "LimitDataset(ds, 3, reset_after_epochs=True, worker_config=wc)",
        "RepeatDataset(ds, repeat=2, worker_config=wc)",
        "get_val_datasets(path, split_part='train', batch_size=2, worker_config=wc, bach_size=3)",
    ],
)
def test_misspelt_keywords_are_type_errors(text50, call):
    from energon import (
        LimitDataset,  # noqa: F401
        RepeatDataset,  # noqa: F401
        WorkerConfig,
        get_loader,  # noqa: F401
        get_savable_loader,  # noqa: F401
        get_val_dataset,
        get_val_datasets,  # noqa: F401
    )

    path = text50
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(path, split_part="train", batch_size=2, worker_config=wc)
    with pytest.raises(TypeError):
        eval(call, {**globals(), **locals()})


def test_unsupported_loader_options_warn(text50):
    from energon import WorkerConfig, get_loader, get_savable_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_val_dataset(text50, split_part="train", batch_size=2, worker_config=wc)
    with pytest.warns(UserWarning, match="gc_collect_every_n_steps=5 has no effect"):
        get_savable_loader(ds, gc_collect_every_n_steps=5)
    get_loader(ds, watchdog_timeout_seconds=5)  # a real watchdog now (tests/observe)
    with pytest.warns(UserWarning, match="n_checkpoints=3 has no effect"):
        get_savable_loader(ds, n_checkpoints=3)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        get_savable_loader(ds, checkpoint_every_sec=60, prefetch_factor=4)  # defaults: silent
    assert [str(w.message) for w in caught] == []


def test_limit_without_reset_continues_on_validation(text50):
    """The reference's default ``reset_after_epoch=False`` works on validation: passes continue
    where the last stopped; a pass that runs out of data ends early and the next starts over."""
    from energon import LimitDataset, RepeatDataset, WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = get_val_dataset(text50, split_part="train", batch_size=5, worker_config=wc)
    everything = [b.__key__ for b in get_loader(ds)]  # 10 batches
    assert len(everything) == 10
    loader = get_loader(LimitDataset(ds, 4, worker_config=wc))
    passes = [[b.__key__ for b in loader] for _ in range(4)]
    assert passes == [everything[:4], everything[4:8], everything[8:], everything[:4]]
    reset = get_loader(LimitDataset(ds, 4, reset_after_epoch=True, worker_config=wc))
    assert [[b.__key__ for b in reset] for _ in range(2)] == [everything[:4]] * 2
    repeated = get_loader(LimitDataset(RepeatDataset(ds, worker_config=wc), 4, worker_config=wc))
    passes = [[b.__key__ for b in repeated] for _ in range(3)]
    assert passes == [everything[:4], everything[4:8], everything[8:] + everything[:2]]
    twice = get_loader(RepeatDataset(ds, repeats=1.5, worker_config=wc))
    assert len(twice) == 15 and [b.__key__ for b in twice] == everything + everything[:5]


# ---- deprecated state methods, ids, worker check ----------------------------------------------

STATE_API_SCRIPT = """
import json, os, sys, warnings
# energon: alias
from megatron.energon import WorkerConfig, get_loader, get_savable_loader, get_train_dataset, get_val_dataset
warnings.simplefilter("ignore")
wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
def dataset():
    return get_train_dataset(sys.argv[1], batch_size=2, worker_config=wc, shuffle_buffer_size=None,
                             max_samples_per_sequence=None)
a, b, c = get_savable_loader(dataset()), get_savable_loader(dataset()), get_loader(dataset())
ids = [a.id, b.id, c.id]
it = iter(a)
for _ in range(3):
    next(it)
state = a.save_state(0)
resumed = get_savable_loader(dataset())
resumed.restore_state(state)
same = next(iter(resumed)).__key__ == next(it).__key__
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    too_many = WorkerConfig(rank=0, world_size=1, num_workers=len(os.sched_getaffinity(0)) + 1)
    result = get_savable_loader(get_val_dataset(sys.argv[1], split_part="train", batch_size=2,
        worker_config=too_many)).check_worker_number_rationality()
print(json.dumps({"id_steps": [j - ids[0] for j in ids], "list": isinstance(state, list),
                  "len": len(state), "same": same, "result": result,
                  "warned": any("worker" in str(w.message) for w in caught)}))
"""


def test_save_state_restore_state_ids_and_worker_check(ref_python, text50):
    theirs, ours = (
        json.loads(out.splitlines()[-1]) for out in both(ref_python, STATE_API_SCRIPT, str(text50))
    )
    assert ours == theirs
    assert ours == {
        "id_steps": [0, 1, 2],
        "list": True,
        "len": 1,
        "same": True,
        "result": None,
        "warned": True,
    }


# ---- debug logs ------------------------------------------------------------------------------

LOG_SCRIPT = """
import sys
# energon: alias
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
path, out, level, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for rank in map(int, sys.argv[5].split(",")):  # ranks of a 2-rank job, one after the other
    wc = WorkerConfig(rank=rank, world_size=2, num_workers=2,
                      worker_debug_path=out + "/{worker_id}.jsonl", worker_log_level=level)
    loader = get_savable_loader(get_train_dataset(path, batch_size=2, worker_config=wc,
        shuffle_buffer_size=None, max_samples_per_sequence=None, virtual_epoch_length=steps // 2))
    for _ in range(2):  # two virtual epochs
        for batch in loader:
            pass
    del loader
"""


def _write_logs(python: str, path, out, steps=10, level=2, one_process=True) -> None:
    """Logs of both ranks; ``one_process=False``: a process per rank (so both loaders are number 0,
    as in a real job)."""
    for ranks in ["0,1"] if one_process else ["0", "1"]:
        run_script(python, LOG_SCRIPT, str(path), str(out), str(level), str(steps), ranks)


def _records(folder) -> dict[str, list[dict]]:
    return {
        f: [json.loads(line) for line in open(os.path.join(folder, f))]
        for f in sorted(os.listdir(folder))
    }


def test_debug_logs_have_the_references_files_and_records(ref_python, text50, tmp_path):
    _write_logs(ref_python, text50, tmp_path / "theirs")
    _write_logs(OUR_PYTHON, text50, tmp_path / "ours")
    theirs, ours = _records(tmp_path / "theirs"), _records(tmp_path / "ours")
    # rank r's main process writes file r * (num_workers + 1), its workers the next ones
    assert list(ours) == list(theirs) == [f"{i}.jsonl" for i in range(6)]

    def shapes(files):
        return {r["t"]: set(r) for records in files.values() for r in records}

    mine, ref = shapes(ours), shapes(theirs)
    # only events the reference writes too (these three only once a slice or epoch ends)
    ends = {
        f"WebdatasetSampleLoaderDataset._slices_iter.{e}" for e in ("exhausted", "all_exhausted")
    }
    assert set(mine) <= set(ref) | ends | {"RepeatDataset.repeat"}
    for event, fields in mine.items():
        if event not in ref:
            continue
        # the pass boundaries are the loader's here (one per rank, not one per worker)
        missing = ref[event] - fields
        assert missing <= {"local_length"}, (event, missing)
    for event in ("__iter__", "_slices_iter.next_epoch", "_slices_iter.yield"):
        assert f"WebdatasetSampleLoaderDataset.{event}" in mine
    for name in ("0.jsonl", "3.jsonl"):  # the loader's records in the main processes
        events = [r["t"] for r in ours[name]]
        assert events[0] == "SavableLoader.__init__"
        assert events.count("SavableDataLoader.yield") == 10  # 2 epochs of 5
        assert (
            events.count("SavableDataLoader.iter")
            == events.count("SavableDataLoader.StopIteration")
            == 2
        )
        assert {r["r"] for r in ours[name]} == {int(name[0]) // 3}
    # every key handed to the user was produced by a worker (yield_batch) and read from disk
    for rank, main in ((0, "0.jsonl"), (1, "3.jsonl")):
        handed = [r["keys"] for r in ours[main] if r["t"] == "SavableDataLoader.yield"]
        workers = [f"{3 * rank + 1}.jsonl", f"{3 * rank + 2}.jsonl"]
        produced = [r["keys"] for w in workers for r in ours[w] if r["t"] == "yield_batch"]
        read = [r["key"] for w in workers for r in ours[w] if r["t"].endswith("_slices_iter.yield")]
        assert all(keys in produced for keys in handed)
        assert {k for keys in handed for k in keys} <= set(read)


VAL_LOG_SCRIPT = """
import sys
# energon: alias
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
wc = WorkerConfig(rank=0, world_size=1, num_workers=1, worker_debug_path=sys.argv[2] + "/{worker_id}.jsonl",
                  worker_log_level=2)
for batch in get_loader(get_val_dataset(sys.argv[1], split_part="train", batch_size=4, worker_config=wc)):
    pass
"""


def test_debug_log_of_a_validation_pass_is_the_references(ref_python, text50, tmp_path):
    """One worker, one pass: the same reader records (epoch start, every sample with its
    epoch_count, each exhausted slice, the end of the epoch) and batches, in the same order."""
    for who, python in (("theirs", ref_python), ("ours", OUR_PYTHON)):
        run_script(python, VAL_LOG_SCRIPT, str(text50), str(tmp_path / who))
    theirs, ours = _records(tmp_path / "theirs")["1.jsonl"], _records(tmp_path / "ours")["1.jsonl"]
    events = [r["t"] for r in ours]
    assert events.count("WebdatasetSampleLoaderDataset._slices_iter.exhausted") == 2  # 2 shards
    assert events[-2:] == [
        "WebdatasetSampleLoaderDataset._slices_iter.all_exhausted",
        "yield_batch",
    ]
    assert ours == theirs


def _pixels(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_analyze_debug_draws_the_references_picture(ref_python, text50, tmp_path):
    """Both tools render the reference's logs into the same image (pixel for pixel)."""
    logs = tmp_path / "logs"
    _write_logs(ref_python, text50, logs, steps=24, level=1, one_process=False)
    ref_out = ref_cli(
        ref_python, "analyze-debug", str(logs), "--heatmap-path", str(tmp_path / "r.png")
    )
    result = CliRunner().invoke(
        cli,
        ["analyze-debug", str(logs), "--heatmap-path", str(tmp_path / "o.png"), "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    found = re.compile(r"Found (\d+) unique sample keys, (\d+) steps")
    assert found.search(ref_out).groups() == found.search(result.output).groups()
    assert "Analyzing 6 logs..." in ref_out and "Analyzing 6 logs..." in result.output
    assert np.array_equal(_pixels(tmp_path / "r.png"), _pixels(tmp_path / "o.png"))


def test_analyze_debug_of_our_validation_logs(text50, tmp_path):
    """The reference's own check: a validation loader with 2 workers, 2 passes of 10 batches."""
    from energon import WorkerConfig, get_loader, get_val_dataset

    wc = WorkerConfig(
        rank=0,
        world_size=1,
        num_workers=2,
        worker_debug_path=str(tmp_path / "logs" / "{worker_id}.jsonl"),
        worker_log_level=1,
    )
    loader = get_loader(get_val_dataset(text50, split_part="train", batch_size=5, worker_config=wc))
    passes = [[b.__key__ for b in loader] for _ in range(2)]
    assert passes[0] == passes[1] and len(passes[0]) == 10
    args = ["analyze-debug", str(tmp_path / "logs"), "--heatmap-path", str(tmp_path / "h.png")]
    result = CliRunner().invoke(cli, [*args, "--no-progress", "--include-modality", "val"])
    assert result.exit_code == 0, result.output
    assert "Analyzing 3 logs..." in result.output
    assert "Found 50 unique sample keys, 20 steps" in result.output
    image = _pixels(tmp_path / "h.png")
    assert image.shape == (50, 20, 3)
    lit = image.any(axis=2)
    assert (lit.sum(axis=0) == 5).all()  # every step used its 5 samples
    assert (lit.sum(axis=1) == 2).all()  # every sample once per pass
    assert np.array_equal(lit[:, :10], lit[:, 10:])  # the same order in both passes
    # the samples' reading order instead of the batches: one column per sample read per worker
    result = CliRunner().invoke(cli, [*args, "--no-progress", "--force-loading-order"])
    assert result.exit_code == 0, result.output
    assert re.search(r"Found 50 unique sample keys, \d+ steps", result.output)
    # a smaller picture merges steps and samples by powers of two (the reference fails here)
    small = ["--heatmap-steps", "7", "--heatmap-samples", "9", "--include-modality", "val"]
    result = CliRunner().invoke(cli, [*args, "--no-progress", *small])
    assert result.exit_code == 0, result.output
    image = _pixels(tmp_path / "h.png")
    assert image.shape == (7, 5, 3)  # 50 keys / 8 per row, 20 steps / 4 per column
    lit = image.any(axis=2)
    assert lit.any(axis=0).all() and lit.any(axis=1).all()  # every step and sample drawn


def test_analyze_debug_asks_which_loader(text50, tmp_path):
    from energon import WorkerConfig, get_loader, get_train_dataset, get_val_dataset

    logs = str(tmp_path / "logs" / "{worker_id}.jsonl")
    wc = WorkerConfig(
        rank=0, world_size=1, num_workers=0, worker_debug_path=logs, worker_log_level=1
    )
    train = get_loader(
        get_train_dataset(
            text50,
            worker_config=wc,
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            virtual_epoch_length=3,
        )
    )
    val = get_loader(get_val_dataset(text50, split_part="train", worker_config=wc, batch_size=10))
    assert len(list(train)) == 3 and len(list(val)) == 5
    args = ["analyze-debug", str(tmp_path / "logs"), "--heatmap-path", str(tmp_path / "h.png")]
    both_kinds = [*args, "--no-progress", "--include-modality", "train,val"]
    result = CliRunner().invoke(cli, both_kinds, input="1\n")
    assert result.exit_code == 0, result.output
    assert "0: train" in result.output and "1: val" in result.output
    assert "Found 50 unique sample keys, 5 steps" in result.output  # the chosen one: val


def test_worker_log_without_path_prints_json_lines(capsys):
    from energon import WorkerConfig

    wc = WorkerConfig(rank=1, world_size=2, num_workers=0, worker_log_level=1)
    assert wc.should_log(1) and not wc.should_log(2)
    wc.worker_log({"t": "custom", "value": 3})
    assert json.loads(capsys.readouterr().out) == {"t": "custom", "value": 3}
    assert inspect.signature(WorkerConfig.worker_log).parameters.keys() == {"self", "data"}


# ---- pickled parts: refused by default, allowed per dataset or per process --------------------

PICKLE_YAML = """sample_type:
  __module__: megatron.energon
  __class__: TextSample
field_map:
  text: pkl
"""

PICKLE_SCRIPT = """
import json, sys
# energon: alias
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
ds = get_val_dataset(sys.argv[1], split_part="train", batch_size=None, worker_config=wc)
print(json.dumps(sorted([s.__key__, s.text] for s in get_loader(ds))))
"""


@pytest.fixture(scope="module")
def pickled_dataset(tmp_path_factory):
    import pickle

    from energon.prepare.dataset import prepare_dataset
    from tests.helpers.tarfiles import write_tar

    root = tmp_path_factory.mktemp("pickled")
    write_tar(root / "a.tar", [(f"{i:03d}.pkl", pickle.dumps(f"text {i}")) for i in range(6)])
    prepare_dataset(root, split_parts_ratio=[("train", 1.0)], progress=False, num_workers=1)
    (root / ".nv-meta" / "dataset.yaml").write_text(PICKLE_YAML)
    return root


def _load_texts(root, **env):
    from energon import WorkerConfig, get_loader, get_val_dataset, reraise_exception

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=reraise_exception)
    ds = get_val_dataset(root, split_part="train", batch_size=None, worker_config=wc)
    return sorted([s.__key__, s.text] for s in get_loader(ds))


def test_pickled_parts_need_one_switch(ref_python, pickled_dataset, tmp_path, monkeypatch):
    from energon.errors import SampleException

    expected = [[f"{i:03d}", f"text {i}"] for i in range(6)]
    # the reference unpickles by default
    assert json.loads(run_script(ref_python, PICKLE_SCRIPT, str(pickled_dataset))) == expected
    # energon refuses, and says exactly how to allow it
    monkeypatch.delenv("ENERGON_ALLOW_PICKLE", raising=False)
    with pytest.raises(SampleException) as refused:
        _load_texts(pickled_dataset)
    message = str(refused.value)
    yaml_path = f"{pickled_dataset}/.nv-meta/dataset.yaml"
    assert f"`allow_pickle: true` in {yaml_path}" in message
    assert "ENERGON_ALLOW_PICKLE=1" in message and "SampleDecoder(allow_pickle=True)" in message
    # per process: one environment variable
    monkeypatch.setenv("ENERGON_ALLOW_PICKLE", "1")
    assert _load_texts(pickled_dataset) == expected
    monkeypatch.delenv("ENERGON_ALLOW_PICKLE")
    # per dataset: one line in its dataset.yaml
    import shutil

    trusted = tmp_path / "trusted"
    shutil.copytree(pickled_dataset, trusted)
    (trusted / ".nv-meta" / "dataset.yaml").write_text(PICKLE_YAML + "allow_pickle: true\n")
    assert _load_texts(trusted) == expected
    with pytest.raises(SampleException):  # and only that dataset
        _load_texts(pickled_dataset)


# ---- traverse_metadataset --------------------------------------------------------------------

TRAVERSE_YAML = """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    blend:
      - weight: 1
        path: ./a
        subflavors: {src: a}
        aux:
          img: filesystem://./files
          remote_img: filesystem+msc://profile/some/folder
          other: ./b
          remote_ds: msc://profile/prepared
      - weight: 2
        path: ./b
        split_part: val
        subflavors: {src: b}
      - weight: 1
        path: ./nested.yaml
        subflavors: {outer: 1}
  val:
    join:
      - path: ./a
      - path: ./b
        split_part: train
    joiner:
      __module__: megatron.energon
      __class__: TextSample
    subflavors: {joined: true}
"""

NESTED_YAML = """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    path: ./c
    subflavors: {inner: 2}
"""

TRAVERSE_SCRIPT = """
import json, sys
# energon: alias
from megatron.energon import traverse_metadataset
out = [[type(r).__name__, str(r.path), r.split_part, {k: str(v) for k, v in r.aux.items()}, r.subflavors,
        sorted({type(p).__name__ for p in [r.path, *r.aux.values()]}), (r.path / "x").name]
       for r in traverse_metadataset(sys.argv[1], split_part="train")]
print(json.dumps(out))
"""


def test_traverse_metadataset_gives_the_references_objects(ref_python, tmp_path, monkeypatch):
    # the reference's path objects look msc profiles up: a POSIX profile named "profile"
    config = {
        "profiles": {
            "profile": {
                "storage_provider": {"type": "file", "options": {"base_path": str(tmp_path)}}
            }
        }
    }
    (tmp_path / "msc.json").write_text(json.dumps(config))
    monkeypatch.setenv("MSC_CONFIG", str(tmp_path / "msc.json"))
    (tmp_path / "m.yaml").write_text(TRAVERSE_YAML)
    (tmp_path / "nested.yaml").write_text(NESTED_YAML)  # the datasets need not exist
    theirs, ours = (
        json.loads(out.splitlines()[-1])
        for out in both(ref_python, TRAVERSE_SCRIPT, str(tmp_path / "m.yaml"))
    )
    assert ours == theirs
    assert [r[0] for r in ours] == ["TraversedDatasetReference"] * 3
    assert [r[5:] for r in ours] == [[["EPath"], "x"]] * 3
    assert ours[0][3] == {
        "img": str(tmp_path / "files"),
        "remote_img": "msc://profile/some/folder",
        "other": str(tmp_path / "b"),
        "remote_ds": "msc://profile/prepared",
    }
    assert ours[2][1:3] == [str(tmp_path / "c"), "train"]
    # joins (which the reference cannot traverse): one reference per member
    from energon import traverse_metadataset

    joined = traverse_metadataset(tmp_path / "m.yaml", split_part="val")
    assert [(str(r.path), r.split_part, r.aux, r.subflavors) for r in joined] == [
        (str(tmp_path / "a"), "val", {}, {"joined": True}),
        (str(tmp_path / "b"), "train", {}, {"joined": True}),
    ]


# ---- AVI frame counts --------------------------------------------------------------------------

AVI_SCRIPT = """
import io, json, sys
# energon: alias
from megatron.energon.av import AVDecoder
decoder = AVDecoder(io.BytesIO(open(sys.argv[1], "rb").read()))
print(json.dumps([decoder.get_metadata().video_num_frames,
                  decoder.get_video_duration(get_frame_count=True)[1]]))
"""


def test_avi_frame_count_is_the_references(ref_python, tmp_path):
    from tests.helpers.avi import avi_with_a_dropped_frame

    path = tmp_path / "dropped.avi"
    path.write_bytes(avi_with_a_dropped_frame(20))  # the header says 21
    theirs, ours = (
        json.loads(out.splitlines()[-1]) for out in both(ref_python, AVI_SCRIPT, str(path))
    )
    assert ours == theirs == [20, 20]


# ---- checkpoint redist: same names and file format as the reference -----------------------------

REDIST_STATES_SCRIPT = """
import sys, torch
# energon: alias
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset
for rank in range(2):  # 2 x 2 workers: the reference re-splits whole workers over the new ranks
    wc = WorkerConfig(rank=rank, world_size=2, num_workers=2)
    loader = get_savable_loader(get_train_dataset(sys.argv[1], batch_size=2, worker_config=wc,
        shuffle_buffer_size=None, max_samples_per_sequence=None))
    it = iter(loader)
    for _ in range(3):
        next(it)
    torch.save({"dataloader_state_dict": loader.save_state_rank()},
               f"{sys.argv[2]}/train_dataloader_dprank{rank:03d}.pt")
"""


def test_checkpoint_redist_names_and_format_match_the_reference(ref_python, text50, tmp_path):
    import zipfile

    for who, python in (("theirs", ref_python), ("ours", OUR_PYTHON)):
        (tmp_path / who).mkdir()
        run_script(python, REDIST_STATES_SCRIPT, str(text50), str(tmp_path / who))
    inputs = {who: sorted(str(p) for p in (tmp_path / who).iterdir()) for who in ("theirs", "ours")}
    (tmp_path / "out_theirs").mkdir()  # the reference needs the folder to exist
    ref_cli(
        ref_python,
        "checkpoint",
        "redist",
        *inputs["theirs"],
        str(tmp_path / "out_theirs"),
        "--new-world-size",
        "4",
    )
    result = CliRunner().invoke(
        cli,
        [
            "checkpoint",
            "redist",
            *inputs["ours"],
            str(tmp_path / "out_ours"),
            "--new-world-size",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    names = {
        who: sorted(p.name for p in (tmp_path / f"out_{who}").iterdir())
        for who in ("theirs", "ours")
    }
    assert (
        names["ours"] == names["theirs"] == [f"train_dataloader_dprank{r:03d}.pt" for r in range(4)]
    )
    for who in ("theirs", "ours"):  # torch.save files (zip archives) holding the Megatron wrapper
        for name in names[who]:
            assert zipfile.is_zipfile(tmp_path / f"out_{who}" / name)
    import torch

    for name in names["ours"]:
        saved = torch.load(tmp_path / "out_ours" / name, weights_only=True)
        assert (
            list(saved) == ["dataloader_state_dict"]
            and saved["dataloader_state_dict"]["world_size"] == 4
        )


def test_restore_errors_go_to_the_restore_error_handler(text50):
    from energon import DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset, stateless

    class Flaky(DefaultTaskEncoder):
        broken = False

        @stateless
        def encode_sample(self, sample):
            if self.broken:
                raise OSError("storage went away")
            return sample

    seen = []
    for handler in (None, lambda e, key, sources: seen.append((type(e).__name__, key))):
        extra = {} if handler is None else {"restore_error_handler": handler}
        wc = WorkerConfig(rank=0, world_size=1, num_workers=0, **extra)
        te = Flaky()
        loader = get_loader(
            get_train_dataset(
                text50,
                batch_size=2,
                worker_config=wc,
                task_encoder=te,
                shuffle_buffer_size=None,
                max_samples_per_sequence=None,
            )
        )
        batch = next(iter(loader))
        te.broken = True
        if handler is None:  # the default re-raises
            with pytest.raises(OSError, match="storage went away"):
                loader.restore_sample(batch.__restore_key__)
        else:
            assert loader.restore_sample(batch.__restore_key__) is None
    assert seen == [("OSError", seen[0][1])] and seen[0][1][0] == "Stream"
