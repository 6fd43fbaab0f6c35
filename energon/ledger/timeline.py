"""Which cursor edits were in force at each item of a stream, from a state's edit history.

An exclusion takes effect in each stream right after the items the stream had emitted when the
state was edited (``history[..]["emitted"][stream]``); before that the stream ran without it. A
migration switches the configuration: items before it belong to the old configuration and cannot
be replayed from the new one (the ledger needs a state saved after the migration to reach them).
"""

from __future__ import annotations

import bisect
import dataclasses

from energon.plan.edits import Exclusion, PlanEdits, edits_from_json


@dataclasses.dataclass(frozen=True)
class Segment:
    """From item ``start`` of a stream on, the plan ran under ``edits`` (None: unedited);
    ``replayable`` is False for items of an earlier configuration (before a migration)."""

    start: int
    edits: PlanEdits | None
    replayable: bool = True


def timeline(edits: PlanEdits | None, stream: int) -> list[Segment]:
    """The segments of ``stream``, sorted by start (of several edits at one point, the last)."""
    if edits is None:
        return [Segment(0, None)]
    history = list(edits.history)
    migrations = [i for i, h in enumerate(history) if h["edit"] == "migrate"]
    excluded: PlanEdits = PlanEdits(sources=edits.sources, next_id=edits.next_id)
    segments = []
    if migrations:
        last = migrations[-1]
        migration = history[last]
        segments.append(Segment(0, None, replayable=False))
        excluded = excluded.with_exclusions(_exclusions(migration))
        segments.append(Segment(_emitted(migration, stream), _or_none(excluded)))
        history = history[last + 1 :]
    else:
        segments.append(Segment(0, _or_none(excluded)))
    for entry in history:
        if entry["edit"] == "exclude":
            excluded = excluded.with_exclusions(_exclusions(entry))
            segments.append(Segment(_emitted(entry, stream), _or_none(excluded)))
    by_start = {segment.start: segment for segment in segments}  # later entries win
    return [by_start[start] for start in sorted(by_start)]


def segment_at(segments: list[Segment], item: int) -> Segment:
    """The segment item ``item`` belongs to."""
    starts = [s.start for s in segments]
    return segments[bisect.bisect_right(starts, item) - 1]


def _emitted(entry: dict, stream: int) -> int:
    emitted = entry["emitted"]
    return int(emitted[stream]) if stream < len(emitted) else 0


def _exclusions(entry: dict) -> list[Exclusion]:
    parsed = edits_from_json({"version": 1, "exclude": entry.get("exclude", [])})
    return list(parsed.exclude) if parsed is not None else []


def _or_none(edits: PlanEdits) -> PlanEdits | None:
    return edits if edits.changes_plan else None
