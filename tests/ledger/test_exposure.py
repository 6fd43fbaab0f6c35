"""Exposure counts written by the ledger equal the counts of a real run (seen and skipped), and the
per-source and per-shard summaries add up."""

from __future__ import annotations

import csv
import json

import numpy as np

from energon.cursor.skip import skip_steps
from energon.ledger.exposure import export_exposures
from energon.ledger.ledger import Ledger
from energon.pipeline.keys import pointer_target, pointers_of
from tests.helpers.datasets import make_text_dataset
from tests.ledger.runs import CONFIGS, DataPackingEncoder, run_ranks, train_dataset, write_blend


def _count(steps, sizes):
    counts = [np.zeros(n, dtype=np.int64) for n in sizes]
    for step in steps:
        for key in step:
            for pointer in pointers_of(key):
                source, index = pointer_target(pointer)
                counts[source][index] += 1
    return counts


def test_exported_counts_equal_a_real_run_with_skipped_steps(text_ds, tmp_path):
    other = make_text_dataset(tmp_path / "other", num_samples=50, num_shards=2, seed=3)
    path = str(write_blend(tmp_path, [text_ds, other], [0.5, 0.5]))
    config = dict(CONFIGS["shuffled"], num_streams=4)
    first, states = run_ranks(path, 2, 4, **config)
    skipped_run, _ = run_ranks(path, 2, 3, states=states, **config)
    edited, _ = skip_steps(states, 3)
    rest, later = run_ranks(path, 2, 10, states=edited, **config)
    ledger = Ledger(train_dataset(path, world_size=2, **config), states=later)
    summary = export_exposures(ledger, str(tmp_path / "out"), until_step=17, progress=False)
    seen = _count(first + rest, [120, 50])
    skipped = _count(skipped_run, [120, 50])
    for n, entry in enumerate(summary["datasets"]):
        counts = np.load(tmp_path / "out" / entry["counts"], mmap_mode="r")
        assert counts.dtype == np.uint32
        assert np.array_equal(counts, seen[n])
        assert np.array_equal(np.load(tmp_path / "out" / entry["skipped_counts"]), skipped[n])
        assert (
            entry["exposures"] == seen[n].sum() and entry["skipped_exposures"] == skipped[n].sum()
        )
    assert json.load(open(tmp_path / "out" / "datasets.json"))["until_step"] == 17
    with open(tmp_path / "out" / "shards.csv") as f:
        shards = list(csv.DictReader(f))
    assert sum(int(s["exposures"]) for s in shards) == sum(c.sum() for c in seen)
    assert {s["shard"] for s in shards} >= {"parts/data-00000.tar", "parts/data-00004.tar"}
    with open(tmp_path / "out" / "sources.csv") as f:
        sources = list(csv.DictReader(f))
    assert [int(s["exposures"]) for s in sources] == [int(c.sum()) for c in seen]


def test_counts_of_data_driven_packing_come_from_the_journal(text_ds, tmp_path):
    config = dict(
        CONFIGS["shuffled"], num_streams=2, task_encoder=DataPackingEncoder(), packing_buffer_size=4
    )
    journal = str(tmp_path / "journal")
    delivered, _ = run_ranks(str(text_ds), 1, 12, journal=journal, **config)
    ledger = Ledger(train_dataset(str(text_ds), **config), journal=journal, strict=True)
    summary = export_exposures(ledger, str(tmp_path / "out"), until_step=12, progress=False)
    counts = np.load(tmp_path / "out" / summary["datasets"][0]["counts"])
    assert np.array_equal(counts, _count(delivered, [120])[0])


def test_counts_from_a_later_step_range(text_ds, tmp_path):
    config = dict(CONFIGS["plain"], num_streams=3)
    delivered, _ = run_ranks(str(text_ds), 3, 9, **config)
    ledger = Ledger(train_dataset(str(text_ds), world_size=3, **config))
    summary = export_exposures(
        ledger, str(tmp_path / "out"), from_step=4, until_step=9, progress=False
    )
    counts = np.load(tmp_path / "out" / summary["datasets"][0]["counts"])
    assert np.array_equal(counts, _count(delivered[4:9], [120])[0])
