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
from energon.errors import ArgumentError
from energon.format.info import read_info
from energon.format.sqlite_index import sample_tables_path
from energon.ledger.ledger import training_spec
from energon.pipeline import snapshot
from energon.pipeline.keys import pointer_target, pointers_in
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
    spec = dataclasses.replace(training_spec(dataset), num_streams=point.num_streams)
    point = upgraded(point, spec.pointer_kinds())
    added, unknown = resolve_exclusions(
        spec, keys=keys, shards=shards, datasets=datasets, within=within
    )
    if not added:
        given = [name for name, v in (("keys", keys), ("shards", shards)) if list(v)]
        raise ArgumentError(
            "/".join(given) or "keys/shards/datasets",
            "nothing to exclude: no key, shard or dataset matched"
            + (f" (keys not found: {', '.join(unknown[:10])})" if unknown else ""),
        )
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
    """Index ranges per dataset of the named keys, shards and datasets (and the unknown keys).
    ``datasets`` and ``within`` name datasets as :func:`sources_named` reads them."""
    ranges: dict[tuple[str, str], list[tuple[int, int]]] = {}
    wanted_keys = set(keys)
    found_keys: set[str] = set()
    shard_names = set(shards)
    whole = sources_named(spec, datasets, "datasets")
    only = sources_named(spec, within, "within") if list(within) else None
    for number, source in enumerate(spec.sources):
        leaf = source.leaf
        identity = (leaf.fingerprint()["path"], leaf.split_part)
        target = ranges.setdefault(identity, [])
        if number in whole:
            target.append((source.start, source.end))
        if only is not None and number not in only:
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


def sources_named(spec: PipelineSpec, names: Iterable[str], argument: str) -> set[int]:
    """The sources that ``names`` name: a dataset path (relative to the current folder or
    absolute: the same; a URL) names every source reading that dataset, a number the source with
    that number. A name that matches no source is an :class:`ArgumentError` of ``argument``
    listing the datasets there are."""
    paths = [epath.normalize(str(s.leaf.fingerprint()["path"])) for s in spec.sources]
    found: set[int] = set()
    for name in names:
        text = str(name).strip()
        if text.isdigit() and int(text) < len(paths):
            found.add(int(text))
            continue
        spelled = epath.normalize(text) if text else text
        matches = {n for n, path in enumerate(paths) if path == spelled}
        if not matches:
            listed = ", ".join(
                f"[{n}] {path} [{s.leaf.split_part}]"
                for n, (path, s) in enumerate(zip(paths, spec.sources))
            )
            shown = f"{text!r}" + (f" ({spelled})" if spelled != text else "")
            raise ArgumentError(
                argument,
                f"{shown} is no dataset of this configuration (expected a dataset path, "
                f"relative or absolute, or a source number; its datasets: {listed})",
            )
        found |= matches
    return found


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
    path = sample_tables_path(leaf.root, "excluding samples by key")
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
            for pointer in pointers_in(stage_state):
                source, index = pointer_target(pointer)
                exclusion = exclusions[source]
                if exclusion is not None and exclusion.contains(index):
                    count += 1
    return count
