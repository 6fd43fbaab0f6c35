"""Where a loader stands: how many of this rank's micro-batches were consumed, and the latest
snapshot of every logical stream it took an item from.

This is the whole of a loader's position. Saving a state copies it
(:mod:`energon.loader.loader_state`), opening workers resumes from it
(:mod:`energon.loader.transport`), and the blend and error reports read its snapshots. Global
micro-batch positions follow the plan: this rank's ``k``-th micro-batch of the current count is
global position ``origin + rank + k * world_size``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from energon.balance.tail import TAIL_FIELD
from energon.loader.recovery import LostSample
from energon.loader.savable_dataset import ResumePoint
from energon.loader.workers.results import with_lost
from energon.pipeline.executor import ItemMeta
from energon.pipeline.snapshot import PackedSnapshot, StreamSnapshot
from energon.state import stream_snapshots


class LoaderPosition:
    """One rank's consumed position: ``origin`` (where the rank's global steps are counted from),
    ``consumed`` (micro-batches taken since), ``pass_offset`` (micro-batches of the current pass),
    ``balance_tail`` (an interrupted balanced window, :mod:`energon.balance.tail`) and the streams'
    snapshots."""

    def __init__(self) -> None:
        self.origin = 0
        self.consumed = 0
        self.pass_offset = 0
        self.balance_tail: dict[str, Any] | None = None
        self.snapshots = {}

    @property
    def snapshots(self) -> dict[int, StreamSnapshot]:
        """The latest snapshot of every stream this pass. Those that came packed from workers
        (:class:`PackedSnapshot`) are unpacked here, when first read: most never are."""
        packed = self._packed
        if packed:
            for stream, snap in packed.items():
                self._plain[stream] = snap.unpack()
            packed.clear()
        return self._plain

    @snapshots.setter
    def snapshots(self, snapshots: dict[int, StreamSnapshot]) -> None:
        self._plain = snapshots
        self._packed: dict[int, PackedSnapshot] = {}

    def all_snapshots(self) -> dict[int, StreamSnapshot]:
        """The snapshots, as a function (for readers that need them only now and then)."""
        return self.snapshots

    def keep(self, stream: int, snap: StreamSnapshot | PackedSnapshot) -> None:
        """Record a stream's latest snapshot; a packed one stays packed until it is read."""
        if isinstance(snap, PackedSnapshot):
            self._packed[stream] = snap
        else:
            self._packed.pop(stream, None)  # the newest wins
            self._plain[stream] = snap

    def record(self, meta: ItemMeta, rank: int, world_size: int) -> None:
        """The item of ``meta`` was taken: its stream's snapshot and the count move on."""
        self.keep(meta.stream, meta.snapshot)
        if meta.others:  # a balanced step advanced several streams (some may come packed)
            for stream, snap in meta.others.items():
                self.keep(stream, snap)
        self.consumed = (meta.position - self.origin - rank) // world_size + 1
        self.pass_offset += 1

    def next_position(self, rank: int, world_size: int) -> int:
        """The global micro-batch position this rank yields next."""
        return self.origin + rank + self.consumed * world_size

    def consumed_boundary(self, world_size: int) -> int:
        """Every global position below this one was consumed (ranks step together)."""
        return self.origin + self.consumed * world_size

    def resume_point(self, world_size: int, board: str | None) -> ResumePoint:
        """Where workers opened now start: right after what was consumed."""
        return ResumePoint(
            base=self.consumed_boundary(world_size),
            origin=self.origin,
            tail=self.balance_tail,
            snapshots=dict(self.snapshots),
            board=board,
        )

    def add_lost(self, lost: LostSample, initial_snapshot: Callable[[int], StreamSnapshot]) -> None:
        """A worker was lost on a sample: the stream's consumed snapshot gets it as pending, so
        that a state saved now skips it too."""
        snap = self.snapshots.get(lost.stream) or initial_snapshot(lost.stream)
        self.snapshots[lost.stream] = with_lost(snap, lost)

    def start_over(self) -> None:
        """After a finite pass (validation, or training with repeat=False) the next starts afresh."""
        self.origin = self.consumed = self.pass_offset = 0
        self.balance_tail = None
        self.snapshots = {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take the position of a checked loader state (:func:`energon.state.check_state_shape`)."""
        self.origin = state["origin"]
        self.consumed = state["consumed"]
        self.pass_offset = state["pass_offset"]
        self.balance_tail = copy.deepcopy(state.get(TAIL_FIELD))
        self.snapshots = copy.deepcopy(stream_snapshots(state))
