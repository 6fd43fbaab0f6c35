"""Cursor edits: plain-data changes of course recorded in a loader state (skip, exclude, migrate).

A loader state is a small cursor over a plan that is a pure function of the configuration. An edit
changes that cursor without touching the configuration file: it skips a range of steps, excludes
samples from the rest of training, or carries the cursor over to an edited metadataset. Everything
an edit changes in the plan is recorded here, as JSON data that travels with the state (versioned,
validated; ``energon.state`` stores it under ``"edits"``):

- ``sources``: per source of the (new) configuration, the number its readers are seeded with
  (``id``) and the rotation of its stream ranges (``rotation``). Without edits both follow from the
  source's position in the configuration; after a migration, continuing sources keep the values they
  had, so their readers continue exactly where they were (same slices, same slice order).
- ``exclude``: per dataset (path, split), sorted disjoint ``[start, end)`` index ranges that are
  never delivered again. The filter sits behind the shuffle buffer, so the other samples keep their
  order exactly (see ``energon.pipeline.pointers.ExcludeFilter``).
- ``history``: what happened when (for the ledger), oldest first. ``{"edit": "skip", "start",
  "end"}``: global positions ``[start, end)`` were skipped. ``{"edit": "exclude", "position",
  "emitted", "exclude"}``: these exclusions took effect after item ``emitted[s]`` of each stream
  ``s``. ``{"edit": "migrate", "position", "emitted", "exclude", "from", "changes"}``: the cursor
  moved to another configuration there (``exclude``: the exclusions carried over). The history
  does not change the plan.

``fingerprint()`` is the part that changes the plan; it becomes part of the state's fingerprint,
so a state describes the edited configuration and restores only into it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from energon.errors import StateError

EDITS_VERSION = 1
HISTORY_KINDS = ("skip", "exclude", "migrate")


@dataclasses.dataclass(frozen=True)
class SourceIdentity:
    """How one source's readers are seeded (``id``) and its stream ranges rotated."""

    id: int
    rotation: int

    def to_json(self) -> dict[str, int]:
        return {"id": self.id, "rotation": self.rotation}


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """Samples of one dataset that are never delivered again: sorted disjoint index ranges."""

    path: str
    split_part: str
    ranges: tuple[tuple[int, int], ...]

    @property
    def count(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def contains(self, index: int) -> bool:
        i = bisect.bisect_right(self.ranges, (index, float("inf"))) - 1
        return i >= 0 and self.ranges[i][0] <= index < self.ranges[i][1]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "split_part": self.split_part,
            "ranges": [[a, b] for a, b in self.ranges],
        }


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, non-empty ``[a, b)`` ranges covering the same indices."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def ranges_of_indices(indices: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Runs of consecutive indices as ranges."""
    return merge_ranges((i, i + 1) for i in indices)


@dataclasses.dataclass(frozen=True)
class PlanEdits:
    """All edits of one state (see the module docstring). Immutable; ``with_*`` return new ones."""

    sources: tuple[SourceIdentity, ...] | None = None
    next_id: int | None = None  # the id the next new source gets (after a migration)
    exclude: tuple[Exclusion, ...] = ()
    history: tuple[dict[str, Any], ...] = ()

    @property
    def empty(self) -> bool:
        return self.sources is None and not self.exclude and not self.history

    def fingerprint(self) -> dict[str, Any]:
        """The plan-changing part (history excluded): goes into the state's fingerprint."""
        return {
            "sources": [s.to_json() for s in self.sources] if self.sources is not None else None,
            "exclude": [e.to_json() for e in self.exclude],
        }

    @property
    def changes_plan(self) -> bool:
        return self.sources is not None or bool(self.exclude)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": EDITS_VERSION,
            **self.fingerprint(),
            "next_id": self.next_id,
            "history": [dict(h) for h in self.history],
        }

    def exclusion_for(self, path: str, split_part: str) -> Exclusion | None:
        for exclusion in self.exclude:
            if (exclusion.path, exclusion.split_part) == (path, split_part):
                return exclusion
        return None

    def with_exclusions(self, added: Sequence[Exclusion]) -> PlanEdits:
        """These edits with more excluded ranges (merged per dataset)."""
        by_dataset = {(e.path, e.split_part): list(e.ranges) for e in self.exclude}
        for exclusion in added:
            by_dataset.setdefault((exclusion.path, exclusion.split_part), []).extend(
                exclusion.ranges
            )
        merged = tuple(
            Exclusion(path, split, merge_ranges(ranges))
            for (path, split), ranges in sorted(by_dataset.items())
            if merge_ranges(ranges)
        )
        return dataclasses.replace(self, exclude=merged)

    def with_history(self, entry: dict[str, Any]) -> PlanEdits:
        return dataclasses.replace(self, history=(*self.history, dict(entry)))

    def skipped_ranges(self) -> list[tuple[int, int]]:
        """Global position ranges ``[start, end)`` that were skipped (never trained on)."""
        return [(int(h["start"]), int(h["end"])) for h in self.history if h["edit"] == "skip"]


def edits_from_json(data: Any) -> PlanEdits | None:
    """Validated edits from a state's ``"edits"`` entry (None stays None); a damaged entry raises a
    :class:`StateError` that says what is wrong."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise StateError(f"loader state field 'edits' must be a dict, got {type(data).__name__}")
    if data.get("version") != EDITS_VERSION:
        raise StateError(
            f"unsupported edits version {data.get('version')!r} in the loader state (this energon "
            f"reads version {EDITS_VERSION})"
        )
    sources = _sources_from_json(data.get("sources"))
    next_id = data.get("next_id")
    if next_id is not None and not _is_int(next_id, minimum=0):
        raise StateError(f"edits: 'next_id' must be an int >= 0, got {next_id!r}")
    if sources is not None and next_id is not None and any(s.id >= next_id for s in sources):
        raise StateError("edits: a source id is not below 'next_id'")
    exclude = tuple(_exclusion_from_json(e) for e in _list(data.get("exclude", []), "exclude"))
    if len({(e.path, e.split_part) for e in exclude}) != len(exclude):
        raise StateError("edits: 'exclude' names a dataset twice")
    history = tuple(_history_from_json(h) for h in _list(data.get("history", []), "history"))
    return PlanEdits(sources=sources, next_id=next_id, exclude=exclude, history=history)


def _list(value: Any, name: str) -> list:
    if not isinstance(value, list):
        raise StateError(f"edits: {name!r} must be a list, got {type(value).__name__}")
    return value


def _is_int(value: Any, minimum: int | None = None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)


def _sources_from_json(data: Any) -> tuple[SourceIdentity, ...] | None:
    if data is None:
        return None
    out = []
    for entry in _list(data, "sources"):
        if not (
            isinstance(entry, dict)
            and _is_int(entry.get("id"), 0)
            and _is_int(entry.get("rotation"), 0)
        ):
            raise StateError(f"edits: bad source entry {entry!r} (need int id and rotation >= 0)")
        out.append(SourceIdentity(entry["id"], entry["rotation"]))
    if len({s.id for s in out}) != len(out):
        raise StateError("edits: two sources share an id")
    return tuple(out)


def _exclusion_from_json(data: Any) -> Exclusion:
    if not (
        isinstance(data, dict)
        and isinstance(data.get("path"), str)
        and isinstance(data.get("split_part"), str)
    ):
        raise StateError(f"edits: bad exclusion {str(data)[:200]} (need path and split_part)")
    ranges = []
    previous_end = -1
    for pair in _list(data.get("ranges"), "exclude ranges"):
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x, 0) for x in pair)):
            raise StateError(f"edits: bad excluded range {pair!r} in {data['path']}")
        a, b = pair
        if not previous_end < a < b:
            raise StateError(
                f"edits: excluded ranges of {data['path']} must be sorted, disjoint and non-empty "
                f"(got [{a}, {b}) after end {previous_end})"
            )
        previous_end = b
        ranges.append((a, b))
    return Exclusion(data["path"], data["split_part"], tuple(ranges))


def _history_from_json(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("edit") not in HISTORY_KINDS:
        raise StateError(f"edits: bad history entry {str(data)[:200]}")
    if data["edit"] == "skip":
        if not (
            _is_int(data.get("start"), 0)
            and _is_int(data.get("end"), 0)
            and data["start"] <= data["end"]
        ):
            raise StateError(f"edits: bad skip entry {data!r}")
    elif not _is_int(data.get("position"), 0):
        raise StateError(f"edits: history entry {str(data)[:200]} needs an int 'position'")
    if data["edit"] in ("exclude", "migrate"):
        emitted = data.get("emitted")
        if not (isinstance(emitted, list) and all(_is_int(x, 0) for x in emitted)):
            raise StateError(
                f"edits: a {data['edit']} entry needs 'emitted': the items each stream had "
                "emitted when it took effect"
            )
        for exclusion in _list(data.get("exclude", []), f"{data['edit']} exclude"):
            _exclusion_from_json(exclusion)
    return dict(data)
