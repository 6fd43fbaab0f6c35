"""The snapshot of one logical stream: the one module that knows its layout.

A snapshot is plain data, taken after every item a stream emits, carried with the item to the main
process and saved in the loader state::

    {"emitted": <items the stream emitted so far>,
     "stages": [<state() of each stage, in chain order>],
     "errors": <the stream's ErrorAccount state: None while nothing failed>}

The first stage of every stream is its pointer source (:mod:`energon.pipeline.pointers`), whose state
holds the schedule's state and one :class:`~energon.plan.reader.ReaderState` per source. Code outside
the pipeline reads snapshots only through the functions here.
"""

from __future__ import annotations

import marshal
from typing import Any, NotRequired, TypedDict

from energon import state_fields as fields
from energon.plan.mixing import ScheduleState
from energon.plan.reader import ReaderState

POINTER_STAGE = 0  # the pointer source is the first stage of every stream


class PointerState(TypedDict):
    current: int  # the source being read, without a schedule (one source after the other)
    passes: int  # passes completed by a finite schedule
    schedule: ScheduleState | None
    readers: list[ReaderState]  # one per source


class StreamSnapshot(TypedDict):
    emitted: int
    stages: list[dict[str, Any]]
    errors: NotRequired[dict[str, Any] | None]  # absent in states saved before error accounts


class PackedSnapshot:
    """A snapshot on its way from a loader worker to the main process: its bytes (``marshal``: plain
    data only, so nothing in them can name a class or run code), unpacked only when the main
    process reads it (a state is saved, statistics are asked for), plus its error account, which
    the main process checks after every item.

    The main process keeps the latest snapshot per stream but reads few of them: rebuilding each
    one (the shuffle buffer's pointers alone are ~100 tuples) cost ~20 us per batch there. The
    bytes never leave the process pair; a saved state holds the unpacked plain data."""

    __slots__ = ("data", "errors")

    def __init__(self, data: bytes, errors: dict[str, Any] | None) -> None:
        self.data = data
        self.errors = errors

    @classmethod
    def pack(cls, snapshot: StreamSnapshot) -> PackedSnapshot:
        return cls(marshal.dumps(snapshot), snapshot.get("errors"))

    def unpack(self) -> StreamSnapshot:
        return marshal.loads(self.data)

    def __reduce__(self) -> tuple:
        return PackedSnapshot, (self.data, self.errors)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedSnapshot):
            other = other.unpack()
        return self.unpack() == other

    __hash__ = None  # type: ignore[assignment]


def unpacked(snapshot: StreamSnapshot | PackedSnapshot) -> StreamSnapshot:
    """The plain snapshot, whether it came packed from a worker or directly from the stream."""
    return snapshot.unpack() if isinstance(snapshot, PackedSnapshot) else snapshot


def make_snapshot(
    emitted: int, stage_states: list[dict[str, Any]], errors: dict[str, Any] | None = None
) -> StreamSnapshot:
    return {"emitted": emitted, "stages": stage_states, "errors": errors}


def error_state(snapshot: StreamSnapshot | PackedSnapshot) -> dict[str, Any] | None:
    """The stream's error account (see :mod:`energon.pipeline.error_account`), None if clean."""
    if isinstance(snapshot, PackedSnapshot):
        return snapshot.errors
    return snapshot.get("errors")


def check_shape(snapshot: Any, where: str) -> None:
    """A ``StateError`` naming the field unless ``snapshot`` (read from a state file) has a
    snapshot's layout: items emitted, and a non-empty list of stage states."""
    fields.int_field(snapshot, "emitted", where)
    stages = fields.list_field(snapshot, "stages", where)
    if not stages or not all(isinstance(stage, dict) for stage in stages):
        raise fields.bad_field(f"{where}.stages", stages, "a list of stage states")


def emitted(snapshot: StreamSnapshot) -> int:
    """Items the stream had emitted when the snapshot was taken."""
    return int(snapshot["emitted"])


def stage_states(snapshot: StreamSnapshot) -> list[dict[str, Any]]:
    return snapshot["stages"]


def with_error_state(snapshot: StreamSnapshot, errors: dict[str, Any] | None) -> StreamSnapshot:
    """The snapshot with another error account (a lost sample added by the main process)."""
    return make_snapshot(emitted(snapshot), stage_states(snapshot), errors)


def with_stage_state(snapshot: StreamSnapshot, index: int, state: dict[str, Any]) -> StreamSnapshot:
    """The snapshot of a chain into which a stage was inserted at ``index`` (a cursor edit that
    adds a stage, e.g. the exclusion filter), with that stage starting from ``state``."""
    stages = list(snapshot["stages"])
    stages.insert(index, state)
    return make_snapshot(emitted(snapshot), stages)


def pointer_state(snapshot: StreamSnapshot) -> PointerState:
    return snapshot["stages"][POINTER_STAGE]  # type: ignore[return-value]


def reader_states(snapshot: StreamSnapshot) -> list[ReaderState]:
    """One reader state per source of the stream (none for a stream composed of other streams,
    e.g. by Megatron-Energon's wrapper datasets, whose first stage is not a pointer source)."""
    return pointer_state(snapshot).get("readers", [])


def samples_read(snapshot: StreamSnapshot) -> list[int]:
    """Sample indices each source's reader handed out (samples in shuffle buffers count as read)."""
    return [int(reader.get("yielded", 0)) for reader in reader_states(snapshot)]


def reader_epochs(snapshot: StreamSnapshot) -> list[int]:
    """The epoch each source's reader is in."""
    return [int(reader["epoch"]) for reader in reader_states(snapshot)]


def latest(snapshots: list[StreamSnapshot]) -> StreamSnapshot:
    """Of several snapshots of one stream (saved by different ranks), the one furthest ahead."""
    return max(snapshots, key=emitted)
