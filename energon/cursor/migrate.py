"""Move a saved cursor to an edited configuration: weights changed, sources added or removed.

Restoring a state into a different configuration is an error (the fingerprint differs), because
the same cursor means different samples there. A migration says what changed and rewrites the
cursor so that it means the same thing for every source that continues:

- a source continues when the new configuration has a source with the same dataset, split and
  sample range; its readers keep their state in every stream (same slices, same slice order: the
  migration pins the number they are seeded with and the rotation of their stream ranges in the
  state's edits), so no sample of it repeats within its epoch;
- a new source starts at its beginning; a removed source is dropped (its samples waiting in shuffle
  buffers are dropped too, and counted);
- the blend schedule starts afresh with the new weights (``blend_epochized``: the counts of the
  current pass are kept per continuing source);
- exclusions of continuing datasets stay in force.

Everything else (seed, batch size, shuffle buffer, task encoder, ...) must be unchanged. The new
states' fingerprint describes the new configuration with these edits; the history records the
migration, so the ledger knows that earlier steps belong to the old configuration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.cursor.savepoint import merge_states, upgraded
from energon.errors import StateError
from energon.ledger.ledger import training_spec
from energon.pipeline import snapshot
from energon.pipeline.keys import as_key, is_pointer
from energon.pipeline.pointers import build_pointer_stages, pointer_source
from energon.pipeline.spec import PipelineSpec, fingerprint_digest
from energon.plan.edits import PlanEdits, SourceIdentity
from energon.state import fingerprint_differences

#: fingerprint fields a migration may change
CHANGEABLE = ("datasets", "mode", "edits")


@dataclasses.dataclass
class MigrationReport:
    """What changed between the state's configuration and the new one."""

    continuing: list[dict[str, Any]]  # path, split, old and new source number, old and new weight
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    dropped_buffered: int  # pointers of removed sources dropped from shuffle buffers
    position: int

    def lines(self) -> list[str]:
        lines = [f"migrated at global position {self.position}:"]
        for c in self.continuing:
            change = ""
            if c["old_weight"] != c["new_weight"] or c["old_repetitions"] != c["new_repetitions"]:
                change = (
                    f": weight {c['old_weight']:.4g} -> {c['new_weight']:.4g}, repetitions "
                    f"{c['old_repetitions']:.4g} -> {c['new_repetitions']:.4g}"
                )
            lines.append(f"  continues (keeps its place) {_name(c)}{change or ': unchanged'}")
        for a in self.added:
            lines.append(f"  added (starts at its beginning) {_name(a)}: weight {a['weight']:.4g}")
        for r in self.removed:
            lines.append(f"  removed {_name(r)}")
        if self.dropped_buffered:
            lines.append(
                f"  {self.dropped_buffered} samples of removed sources waiting in shuffle buffers "
                "were dropped"
            )
        return lines


def _name(entry: dict[str, Any]) -> str:
    start, end = entry["range"]
    return f"{entry['path']} [{entry['split']}] samples {start}..{end - 1}"


def migrate_states(
    states: list[dict[str, Any]], dataset: Any
) -> tuple[list[dict[str, Any]], MigrationReport]:
    """States (one per rank) of the old configuration, rewritten for ``dataset`` (the new
    configuration's ``get_train_dataset``; same loader options as before)."""
    point = merge_states(states)
    old_fp = point.state["fingerprint"]
    new_spec: PipelineSpec = dataclasses.replace(
        training_spec(dataset), num_streams=point.num_streams, edits=None
    )
    _check_only_datasets_changed(old_fp, new_spec.fingerprint())
    old = _old_sources(old_fp, point.edits, point.num_streams)
    mapping, report_entries = _match(old, new_spec)
    identities, next_id = _identities(old, mapping, new_spec, point.edits)
    carried = [
        e
        for e in (point.edits.exclude if point.edits is not None else ())
        if any(
            (s.leaf.fingerprint()["path"], s.leaf.split_part) == (e.path, e.split_part)
            for s in new_spec.sources
        )
    ]
    history = point.edits.history if point.edits is not None else ()
    edits = PlanEdits(
        sources=tuple(identities), next_id=next_id, exclude=tuple(carried), history=history
    )
    edits = edits.with_history(
        {
            "edit": "migrate",
            "position": point.position,
            "emitted": point.emitted_list(),
            "exclude": [e.to_json() for e in carried],
            "from": point.state["fingerprint_digest"],
            "changes": {
                "added": [_short(a) for a in report_entries["added"]],
                "removed": [_short(r) for r in report_entries["removed"]],
                "continuing": len(report_entries["continuing"]),
            },
        }
    )
    spec = dataclasses.replace(new_spec, edits=edits)
    point = upgraded(point, [o["kind"] for o in old])
    old_had_filter = point.edits is not None and bool(point.edits.exclude)
    dropped = 0
    snapshots = {}
    for stream, snap in point.snapshots.items():
        snapshots[stream], lost = _translate(
            snap, stream, spec, mapping, old_had_filter, bool(carried), len(old)
        )
        dropped += lost
    fingerprint = spec.fingerprint()
    new_states = point.rank_states(
        snapshots=snapshots,
        edits=edits,
        fingerprint=fingerprint,
        digest=fingerprint_digest(fingerprint),
    )
    report = MigrationReport(
        continuing=report_entries["continuing"],
        added=report_entries["added"],
        removed=report_entries["removed"],
        dropped_buffered=dropped,
        position=point.position,
    )
    return new_states, report


def _short(entry: dict[str, Any]) -> list[Any]:
    return [entry["path"], entry["split"], list(entry["range"])]


def _check_only_datasets_changed(old: dict[str, Any], new: dict[str, Any]) -> None:
    diffs = [
        d
        for d in fingerprint_differences(
            {k: v for k, v in old.items() if k not in CHANGEABLE},
            {k: v for k, v in new.items() if k not in CHANGEABLE},
        )
    ]
    if diffs:
        raise StateError(
            "a migration changes the datasets only; these loader settings differ from the "
            "state's:\n  " + "\n  ".join(diffs)
        )
    if not new.get("training"):
        raise StateError("only training states can be migrated")


def _old_sources(
    fingerprint: dict[str, Any], edits: PlanEdits | None, num_streams: int
) -> list[dict[str, Any]]:
    """The state's sources: identity, weight, and the seed number and rotation their readers
    use (pinned by earlier edits, else as the configuration's order gives them)."""
    datasets = fingerprint["datasets"]
    rotations, total = [], 0
    for d in datasets:
        rotations.append(total % num_streams)
        total += d["range"][1] - d["range"][0]
    out = []
    for i, d in enumerate(datasets):
        identity = edits.sources[i] if edits is not None and edits.sources is not None else None
        out.append(
            {
                "path": d["path"],
                "split": d["split_part"],
                "range": tuple(d["range"]),
                "weight": d["weight"],
                "repetitions": d["repetitions"],
                "id": identity.id if identity is not None else i,
                "rotation": identity.rotation if identity is not None else rotations[i],
                "kind": _kind(d),
            }
        )
    return out


def _kind(described: dict[str, Any]) -> str:
    if "megatron" in described:
        return "tokens"
    if "join" in described:
        return "join"
    if described.get("format") == "parquet":
        return "parquet"
    if described["path"].endswith(".jsonl"):
        return "jsonl"
    return "webdataset"


def _identity(source: Any) -> tuple[str, str, tuple[int, int]]:
    return (source.leaf.fingerprint()["path"], source.leaf.split_part, (source.start, source.end))


def _match(
    old: list[dict[str, Any]], spec: PipelineSpec
) -> tuple[dict[int, int], dict[str, list[dict[str, Any]]]]:
    """old source number -> new source number of the continuing sources, and the report."""
    by_identity: dict[tuple, list[int]] = {}
    for i, o in enumerate(old):
        by_identity.setdefault((o["path"], o["split"], o["range"]), []).append(i)
    mapping: dict[int, int] = {}
    continuing, added = [], []
    for j, source in enumerate(spec.sources):
        candidates = by_identity.get(_identity(source), [])
        entry = {
            "path": _identity(source)[0],
            "split": source.leaf.split_part,
            "range": (source.start, source.end),
        }
        if candidates:
            i = candidates.pop(0)
            mapping[i] = j
            continuing.append(
                {
                    **entry,
                    "old_source": i,
                    "new_source": j,
                    "old_weight": old[i]["weight"],
                    "new_weight": source.weight,
                    "old_repetitions": old[i]["repetitions"],
                    "new_repetitions": source.repetitions,
                }
            )
        else:
            added.append({**entry, "new_source": j, "weight": source.weight})
    removed = [
        {"path": o["path"], "split": o["split"], "range": o["range"], "old_source": i}
        for i, o in enumerate(old)
        if i not in mapping
    ]
    return mapping, {"continuing": continuing, "added": added, "removed": removed}


def _identities(
    old: list[dict[str, Any]],
    mapping: dict[int, int],
    spec: PipelineSpec,
    edits: PlanEdits | None,
) -> tuple[list[SourceIdentity], int]:
    """Seed numbers and rotations of the new sources: continuing ones keep theirs, new ones get
    fresh numbers (never used before) and the rotation their position gives them."""
    used = [o["id"] for o in old]
    next_id = max([*used, (edits.next_id or 0) - 1 if edits is not None else -1]) + 1
    reverse = {j: i for i, j in mapping.items()}
    default_rotations = dataclasses.replace(spec, edits=None).source_rotations()
    identities = []
    for j in range(len(spec.sources)):
        if j in reverse:
            o = old[reverse[j]]
            identities.append(SourceIdentity(o["id"], o["rotation"]))
        else:
            identities.append(SourceIdentity(next_id, default_rotations[j]))
            next_id += 1
    return identities, next_id


def _translate(
    snap: Any,
    stream: int,
    spec: PipelineSpec,
    mapping: dict[int, int],
    had_filter: bool,
    has_filter: bool,
    old_count: int,
) -> tuple[Any, int]:
    """A stream's snapshot with its sources renumbered (see the module docstring); returns it and
    how many buffered pointers of removed sources were dropped."""
    stages = list(snapshot.stage_states(snap))
    fresh = pointer_source(spec, stream)
    pointer = stages[0]
    old_readers = pointer["readers"]
    if len(old_readers) != old_count:
        raise StateError(f"stream {stream}: the snapshot has {len(old_readers)} readers")
    readers = fresh.state()["readers"]
    reverse = {j: i for i, j in mapping.items()}
    for j in range(len(readers)):
        if j in reverse:
            readers[j] = old_readers[reverse[j]]
    schedule = None
    old_schedule = pointer.get("schedule")
    if spec.mode == "repetitions" and old_schedule is not None and fresh.schedule is not None:
        counts = [0] * len(readers)
        for i, j in mapping.items():
            counts[j] = min(int(old_schedule["counts"][i]), fresh.schedule.quotas[j])
        schedule = {"picks": sum(counts), "counts": counts}
    stages[0] = {
        **pointer,
        "current": 0,
        "schedule": schedule,
        "readers": readers,
    }
    dropped = 0
    pointer_count = len(build_pointer_stages(dataclasses.replace(spec, edits=None), stream))
    for k in range(1, len(stages)):
        stages[k], lost = _renumber(stages[k], mapping, buffer=k < pointer_count)
        dropped += lost
    if has_filter and not had_filter:
        stages.insert(pointer_count, {"dropped": 0})
    elif had_filter and not has_filter:
        del stages[pointer_count]
    return snapshot.make_snapshot(snapshot.emitted(snap), stages), dropped


def _renumber(data: Any, mapping: dict[int, int], *, buffer: bool) -> tuple[Any, int]:
    """Stage state data with every sample pointer's source renumbered. In the shuffle buffer
    (``buffer``) pointers of removed sources are dropped; elsewhere they cannot be (packing or
    grouping buffers): that is an error."""
    dropped = 0
    if isinstance(data, dict):
        out = {}
        for name, value in data.items():
            out[name], lost = _renumber(value, mapping, buffer=buffer)
            dropped += lost
        return out, dropped
    if isinstance(data, list | tuple):
        key = as_key(data)
        if _looks_like_pointer(key):
            if key[1] in mapping:
                return [key[0], mapping[key[1]], key[2]], 0
            if buffer:
                return None, 1
            raise StateError(
                f"samples of a removed source wait in a packing or grouping buffer ({list(key)}): "
                "migrate from a state saved while those buffers hold none of its samples, or keep "
                "the source with weight near zero"
            )
        items = []
        for value in data:
            renumbered, lost = _renumber(value, mapping, buffer=buffer)
            dropped += lost
            if renumbered is not None or not _looks_like_pointer(as_key(value)):
                items.append(renumbered)
        return items, dropped
    return data, 0


def _looks_like_pointer(key: Any) -> bool:
    return (
        isinstance(key, tuple)
        and len(key) == 3
        and isinstance(key[0], str)
        and isinstance(key[1], int)
        and isinstance(key[2], int)
        and is_pointer(key)
    )
