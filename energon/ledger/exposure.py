"""Exposure counts: how many times each sample was seen up to a step, without Python objects per
sample.

:func:`export_exposures` walks every logical stream over the positions of the asked steps (the
simulated streams jump, and their pointer stages count into the arrays in C) and writes, into a
directory:

- ``counts/<n>.npy``: per dataset split, a ``uint32`` array indexed like the dataset (sample ``i``
  of the split: shards in split order), memory-mappable (``np.load(path, mmap_mode="r")``);
  ``counts/<n>.skipped.npy`` likewise for steps that cursor edits skipped (never trained on);
- ``datasets.json``: per dataset: its path, split, samples, array files and totals;
- ``sources.csv``: per source of the configuration: exposures within its sample range;
- ``shards.csv``: per shard: samples, exposures, samples seen at least once, the most-seen count.

Micro-batches recorded in a journal are counted from the journal (what was delivered); the others
from the plan, under the simulation's assumption (every sample loads, hooks pass samples 1:1).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from tqdm import tqdm

from energon import arguments
from energon.errors import ArgumentError
from energon.ledger.advance import add_counts
from energon.ledger.ledger import Ledger, StreamWalker
from energon.pipeline.keys import pointers_of
from energon.source.meta import meta_reader

COUNTS_DIR = "counts"


def items_below(position: int, stream: int, num_streams: int) -> int:
    """How many items of ``stream`` lie at global positions below ``position``."""
    return max(0, -(-(position - stream) // num_streams))


def export_exposures(
    ledger: Ledger,
    directory: str,
    *,
    until_step: int,
    from_step: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Count exposures over steps ``from_step <= step < until_step`` into ``directory`` (see the
    module docstring); returns the summary written to ``datasets.json``."""
    arguments.step_span(from_step, until_step, ("from_step", "until_step"))
    balance = ledger.spec.balance
    if balance is not None and (from_step % balance.window or until_step % balance.window):
        raise ArgumentError(
            "from_step/until_step",
            f"balanced steps are planned {balance.window} at a time, each step holding samples "
            "of the whole window's positions: count exposures from and until multiples of "
            f"Balance.window={balance.window}",
        )
    per_step = ledger.world_size * ledger.micro_batches_per_step
    start, end = from_step * per_step, until_step * per_step
    os.makedirs(os.path.join(directory, COUNTS_DIR), exist_ok=True)
    spec = ledger.spec
    datasets = _datasets(spec)
    skipped_any = any(a < end and b > start for a, b in ledger.skipped)
    seen = _arrays(directory, spec, datasets, "")
    skipped = _arrays(directory, spec, datasets, ".skipped") if skipped_any else None
    per_source_seen = [seen[d] for d in _dataset_of_sources(spec)]
    per_source_skipped = [skipped[d] for d in _dataset_of_sources(spec)] if skipped else None
    journal = ledger.journal
    recorded = journal.positions() if journal is not None else np.zeros(0, dtype=np.int64)
    recorded = recorded[(recorded >= start) & (recorded < end)]
    streams = range(spec.num_streams)
    with tqdm(streams, desc="Counting streams", unit="stream", disable=not progress) as bar:
        for stream in bar:
            intervals = list(_intervals(ledger, stream, start, end, recorded))
            walker = None
            for first, stop, label in intervals:
                if label == "journal":
                    for item in range(first, stop):
                        found = journal.lookup(item * spec.num_streams + stream)  # type: ignore[union-attr]
                        add_counts(per_source_seen, pointers_of(found[2]))  # type: ignore[index]
                    continue
                if walker is None:
                    walker = StreamWalker(ledger, stream)
                walker.advance_to(first)
                counts = per_source_skipped if label == "skipped" else per_source_seen
                walker.advance_to(stop, counts)
    for arrays in (seen, skipped or {}):
        for array in arrays.values():
            array.flush()
    summary = _write_summaries(directory, ledger, datasets, seen, skipped)
    summary.update({"from_step": from_step, "until_step": until_step, "positions": [start, end]})
    with open(os.path.join(directory, "datasets.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _intervals(
    ledger: Ledger, stream: int, start: int, end: int, recorded: np.ndarray
) -> Iterator[tuple[int, int, str]]:
    """Item ranges of ``stream`` in positions ``[start, end)`` labelled "seen", "skipped" or
    "journal", in order."""
    L = ledger.num_streams
    first, stop = items_below(start, stream, L), items_below(end, stream, L)
    labels: dict[int, str] = {}
    for item in (recorded[recorded % L == stream] // L).tolist():
        labels[int(item)] = "journal"
    skipped_items = [
        (items_below(a, stream, L), items_below(b, stream, L)) for a, b in ledger.skipped
    ]
    item = first
    while item < stop:
        label = _label(item, labels, skipped_items)
        run_end = item + 1
        while run_end < stop and _label(run_end, labels, skipped_items) == label:
            run_end += 1
        yield item, run_end, label
        item = run_end


def _label(item: int, labels: dict[int, str], skipped: list[tuple[int, int]]) -> str:
    if item in labels:
        return labels[item]
    return "skipped" if any(a <= item < b for a, b in skipped) else "seen"


def _datasets(spec: Any) -> list[tuple[str, str]]:
    """The distinct (path, split) of the configuration's sources, in order."""
    seen: list[tuple[str, str]] = []
    for key in _dataset_of_sources(spec):
        if key not in seen:
            seen.append(key)
    return seen


def _dataset_of_sources(spec: Any) -> list[tuple[str, str]]:
    return [(s.leaf.fingerprint()["path"], s.leaf.split_part) for s in spec.sources]


def _leaf_of(spec: Any, dataset: tuple[str, str]) -> Any:
    for source, key in zip(spec.sources, _dataset_of_sources(spec)):
        if key == dataset:
            return source.leaf
    raise KeyError(dataset)


def _arrays(
    directory: str, spec: Any, datasets: list[tuple[str, str]], suffix: str
) -> dict[tuple[str, str], np.ndarray]:
    """One zeroed, memory-mapped uint32 ``.npy`` per dataset (``w+`` creates it full of zeros)."""
    return {
        dataset: np.lib.format.open_memmap(
            os.path.join(directory, COUNTS_DIR, f"{n}{suffix}.npy"),
            mode="w+",
            dtype=np.uint32,
            shape=(len(_leaf_of(spec, dataset)),),
        )
        for n, dataset in enumerate(datasets)
    }


def _write_summaries(
    directory: str,
    ledger: Ledger,
    datasets: list[tuple[str, str]],
    seen: dict[tuple[str, str], np.ndarray],
    skipped: dict[tuple[str, str], np.ndarray] | None,
) -> dict[str, Any]:
    spec = ledger.spec
    entries = []
    for n, dataset in enumerate(datasets):
        array = seen[dataset]
        entries.append(
            {
                "path": dataset[0],
                "split": dataset[1],
                "samples": int(len(array)),
                "counts": f"{COUNTS_DIR}/{n}.npy",
                "skipped_counts": f"{COUNTS_DIR}/{n}.skipped.npy" if skipped else None,
                "exposures": int(array.sum(dtype=np.uint64)),
                "samples_seen": int(np.count_nonzero(array)),
                "max_count": int(array.max()) if len(array) else 0,
                "skipped_exposures": int(skipped[dataset].sum(dtype=np.uint64)) if skipped else 0,
            }
        )
    with open(os.path.join(directory, "sources.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["source", "path", "split", "start", "end", "weight", "repetitions", "exposures"]
        )
        for i, (source, dataset) in enumerate(zip(spec.sources, _dataset_of_sources(spec))):
            exposures = int(seen[dataset][source.start : source.end].sum(dtype=np.uint64))
            writer.writerow(
                [
                    i,
                    *dataset,
                    source.start,
                    source.end,
                    source.weight,
                    source.repetitions,
                    exposures,
                ]
            )
    with open(os.path.join(directory, "shards.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["path", "split", "shard", "start", "samples", "exposures", "samples_seen", "max_count"]
        )
        for dataset in datasets:
            leaf = _leaf_of(spec, dataset)
            reader = meta_reader(leaf)
            array = seen[dataset]
            bounds = [*[int(s) for s in leaf.shard_starts], len(leaf)]
            for a, b in zip(bounds, bounds[1:]):
                part = array[a:b]
                writer.writerow(
                    [
                        *dataset,
                        reader.shard_name(a) if b > a else "",
                        a,
                        b - a,
                        int(part.sum(dtype=np.uint64)),
                        int(np.count_nonzero(part)),
                        int(part.max()) if b > a else 0,
                    ]
                )
    return {
        "format": "energon-exposures",
        "version": 1,
        "world_size": ledger.world_size,
        "micro_batches_per_step": ledger.micro_batches_per_step,
        "num_streams": ledger.num_streams,
        "assumptions": ledger.assumptions,
        "datasets": entries,
    }
