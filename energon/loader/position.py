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
from collections.abc import Callable, Mapping
from typing import Any

from energon.balance.tail import TAIL_FIELD
from energon.loader.recovery import LostSample
from energon.loader.savable_dataset import ResumePoint
from energon.loader.workers.results import with_lost
from energon.pipeline.executor import ItemMeta
from energon.pipeline.snapshot import PackedSnapshot, StreamSnapshot, unpacked
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
        window = self._window
        if window is not None:  # every stream, under what was kept after it
            self._window = None
            for stream in window:
                if stream not in self._packed and stream not in self._plain:
                    self._plain[stream] = unpacked(window[stream])
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
        # a balanced window's snapshots of every stream (ItemMeta.window_streams), kept whole:
        # what ``_plain`` / ``_packed`` hold was kept after it and wins
        self._window: Mapping[int, StreamSnapshot | PackedSnapshot] | None = None
        self._window_seen: object = None  # the last one taken (``_window`` is read once)

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
        window = meta.window_streams  # a balanced step: every stream (some may come packed)
        if window is not None and window is not self._window_seen:
            self._take_window(window)
        if meta.others:
            for stream, snap in meta.others.items():
                self.keep(stream, snap)
        self.keep(meta.stream, meta.snapshot)
        self.consumed = (meta.position - self.origin - rank) // world_size + 1
        self.pass_offset += 1

    def _take_window(self, window: Mapping[int, StreamSnapshot | PackedSnapshot]) -> None:
        """Every stream moved to ``window`` (a balanced window's start or end): kept as one
        mapping, read only when a state is saved; what was kept before of its streams is older."""
        self._window = self._window_seen = window
        if self._plain:
            self._plain = {s: snap for s, snap in self._plain.items() if s not in window}
        if self._packed:
            self._packed = {s: snap for s, snap in self._packed.items() if s not in window}

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
