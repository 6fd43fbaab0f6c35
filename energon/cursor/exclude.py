"""Exclude data from now on: samples (by key), shards or whole sources, without moving the rest.

The exclusion becomes a cursor edit (:mod:`energon.plan.edits`): per dataset, index ranges that a
filter behind each stream's shuffle buffer drops (``energon.pipeline.pointers.ExcludeFilter``).
Everything before the filter runs exactly as before, so every other sample keeps its order: the
stream is the old one with the excluded samples taken out. Samples already waiting in packing or
grouping buffers when the state was saved are still delivered (at most those buffers' size per
stream; the report counts them). The edit is recorded with the point where it took effect in each
stream, so the ledger reproduces the steps before and after it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterable
from typing import Any

from energon import epath
from energon.cursor.savepoint import merge_states, upgraded
from energon.format.info import read_info
from energon.format.layout import INDEX_SQLITE_FILENAME, MAIN_FOLDER_NAME
from energon.pipeline import snapshot
from energon.pipeline.keys import as_key, is_pointer, pointer_target
from energon.pipeline.pointers import build_pointer_stages
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.plan.edits import Exclusion, PlanEdits, merge_ranges, ranges_of_indices


@dataclasses.dataclass
class ExcludeReport:
    """What an exclusion covers: per dataset, how many samples; keys that were not found; samples
    already in packing or grouping buffers (still delivered)."""

    datasets: list[dict[str, Any]]
    unknown_keys: list[str]
    buffered: int
    position: int

    def lines(self) -> list[str]:
        lines = [
            f"excluded from global position {self.position} on (every other sample keeps its order):"
        ]
        for d in self.datasets:
            lines.append(f"  {d['path']} [{d['split']}]: {d['samples']} samples")
        if self.unknown_keys:
            shown = ", ".join(self.unknown_keys[:10])
            more = f" and {len(self.unknown_keys) - 10} more" if len(self.unknown_keys) > 10 else ""
            lines.append(f"  keys not found in any dataset: {shown}{more}")
        if self.buffered:
            lines.append(
                f"  {self.buffered} excluded samples already wait in packing/grouping buffers and "
                "will still be delivered"
            )
        return lines


def exclude_samples(
    states: list[dict[str, Any]],
    *,
    keys: Iterable[str] = (),
    shards: Iterable[str] = (),
    datasets: Iterable[str] = (),
    within: Iterable[str] = (),
    dataset: Any = None,
) -> tuple[list[dict[str, Any]], ExcludeReport]:
    """States (one per rank) that never deliver the named samples again.

    ``keys``: sample keys (in every dataset that has them, or only in the datasets ``within``
    names); ``shards``: shard names as listed in the split (``parts/data-3.tar``) or their full
    paths (also restricted by ``within``); ``datasets``: dataset paths (or source numbers as
    strings) whose every sample is excluded. ``dataset``: the training dataset of the configuration
    (by default rebuilt from the state).
    """
    point = merge_states(states)
    if dataset is None:
        from energon.cursor.rebuild import dataset_from_state

        dataset = dataset_from_state(point.state)
    spec: PipelineSpec = dataclasses.replace(dataset.spec, num_streams=point.num_streams)
    point = upgraded(point, spec.pointer_kinds())
    added, unknown = resolve_exclusions(
        spec, keys=keys, shards=shards, datasets=datasets, within=within
    )
    if not added:
        raise ValueError("nothing to exclude: no key, shard or dataset matched")
    before = point.edits
    edits = (before or PlanEdits()).with_exclusions(added)
    edits = edits.with_history(
        {
            "edit": "exclude",
            "position": point.position,
            "emitted": point.emitted_list(),
            "exclude": [e.to_json() for e in added],
        }
    )
    new_spec = dataclasses.replace(spec, edits=edits)
    snapshots = dict(point.snapshots)
    if not (before is not None and before.exclude):
        filter_at = len(build_pointer_stages(dataclasses.replace(spec, edits=before), 0))
        for stream, snap in snapshots.items():
            snapshots[stream] = snapshot.with_stage_state(snap, filter_at, {"dropped": 0})
    fingerprint = new_spec.fingerprint()
    new_states = point.rank_states(
        snapshots=snapshots,
        edits=edits,
        fingerprint=fingerprint,
        digest=fingerprint_digest(fingerprint),
    )
    report = ExcludeReport(
        datasets=[{"path": e.path, "split": e.split_part, "samples": e.count} for e in added],
        unknown_keys=unknown,
        buffered=_buffered(snapshots, new_spec),
        position=point.position,
    )
    return new_states, report


def resolve_exclusions(
    spec: PipelineSpec,
    *,
    keys: Iterable[str] = (),
    shards: Iterable[str] = (),
    datasets: Iterable[str] = (),
    within: Iterable[str] = (),
) -> tuple[list[Exclusion], list[str]]:
    """Index ranges per dataset of the named keys, shards and datasets (and the unknown keys)."""
    ranges: dict[tuple[str, str], list[tuple[int, int]]] = {}
    wanted_keys = set(keys)
    found_keys: set[str] = set()
    shard_names = set(shards)
    whole = set(datasets)
    only = {epath.normalize(p) for p in within}
    for number, source in enumerate(spec.sources):
        leaf = source.leaf
        identity = (leaf.fingerprint()["path"], leaf.split_part)
        target = ranges.setdefault(identity, [])
        if identity[0] in whole or str(number) in whole or leaf.root in whole:
            target.append((source.start, source.end))
        if only and leaf.root not in only and identity[0] not in only:
            continue
        target += _shard_ranges(leaf, shard_names)
        if wanted_keys:
            indices, hits = _key_indices(leaf, wanted_keys)
            found_keys |= hits
            target += ranges_of_indices(indices)
    exclusions = [
        Exclusion(path, split, merge_ranges(r)) for (path, split), r in ranges.items() if r
    ]
    return exclusions, sorted(wanted_keys - found_keys)


def _shard_ranges(leaf: Any, names: set[str]) -> list[tuple[int, int]]:
    if not names or not hasattr(leaf, "shard_names"):
        return []
    bounds = [*[int(s) for s in leaf.shard_starts], len(leaf)]
    out = []
    for i, name in enumerate(leaf.shard_names):
        if name in names or epath.join(leaf.root, name) in names:
            out.append((bounds[i], bounds[i + 1]))
    return out


def _key_indices(leaf: Any, keys: set[str]) -> tuple[list[int], set[str]]:
    """Indices in ``leaf`` of the keys it has (one indexed query per 500 keys)."""
    if leaf.kind == "jsonl":
        hits = {k for k in keys if k.isdigit() and int(k) < len(leaf)}
        return [int(k) for k in hits], hits
    if leaf.kind == "parquet":
        return leaf.key_indices(keys)
    if leaf.kind != "webdataset" or not hasattr(leaf, "shard_names"):
        return [], set()
    path = epath.local_copy(epath.join(leaf.root, MAIN_FOLDER_NAME, INDEX_SQLITE_FILENAME))
    tar_names = list(read_info(leaf.root))
    shard_of_tar = {
        tar_names.index(name): n for n, name in enumerate(leaf.shard_names) if name in tar_names
    }
    starts = [int(s) for s in leaf.shard_starts]
    indices, hits = [], set()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        wanted = sorted(keys)
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            rows = db.execute(
                "SELECT sample_key, tar_file_id, sample_index FROM samples WHERE sample_key IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
            for key, tar_id, inner in rows:
                shard = shard_of_tar.get(tar_id)
                if shard is not None:
                    indices.append(starts[shard] + int(inner))
                    hits.add(key)
    finally:
        db.close()
    return indices, hits


def _buffered(snapshots: dict[int, Any], spec: PipelineSpec) -> int:
    """Excluded samples sitting in the buffers behind the pointer stages (still delivered)."""
    exclusions = spec.exclusions()
    pointer_stages = len(build_pointer_stages(spec, 0))
    count = 0
    for snap in snapshots.values():
        for stage_state in snapshot.stage_states(snap)[pointer_stages:]:
            for pointer in _pointers_in(stage_state):
                source, index = pointer_target(pointer)
                exclusion = exclusions[source]
                if exclusion is not None and exclusion.contains(index):
                    count += 1
    return count


def _pointers_in(data: Any) -> list[tuple]:
    """Every sample pointer inside a stage's state (keys nested in JSON data)."""
    if isinstance(data, dict):
        return [p for value in data.values() for p in _pointers_in(value)]
    if isinstance(data, list | tuple):
        key = as_key(data)
        if (
            len(key) == 3
            and isinstance(key[0], str)
            and isinstance(key[1], int)
            and isinstance(key[2], int)
            and is_pointer(key)
        ):
            return [key]
        return [p for value in data for p in _pointers_in(value)]
    return []
