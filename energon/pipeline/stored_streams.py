"""Every logical stream's snapshot at a balanced window's start or end, read from a plan store
(:mod:`energon.balance.store`), as the loader's items carry them.

A balanced step's item carries every stream's snapshot so that a state can be saved at any step
(:mod:`energon.pipeline.balanced_executor`). With thousands of ranks that is thousands of
snapshots per step; from a store they stay in the published (immutable) file: one mapping per
window's start or end, shared by the window's items, pickled as the file's path, and decoded
only when a state is saved.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from energon.balance.store import StoredSnapshots, open_window
from energon.errors import PlanStoreError
from energon.pipeline.snapshot import PackedSnapshot


def packed_streams(snapshots: StoredSnapshots) -> PackedStreams:
    """The stored snapshots as items carry them, without reading any."""
    return PackedStreams(snapshots.path, snapshots.at_end, len(snapshots), snapshots)


class PackedStreams(Mapping[int, PackedSnapshot]):
    """Every stream's snapshot at a stored window's start or end as loader items carry them
    (:class:`~energon.pipeline.snapshot.PackedSnapshot`, decoded only when a state is saved).
    Pickled as the file's path and the half, not the bytes: a published window never changes,
    so the process that reads a snapshot maps the file itself, when it first reads one."""

    def __init__(
        self, path: Path, end: bool, streams: int, snapshots: StoredSnapshots | None = None
    ) -> None:
        self.path, self.end, self._streams = path, end, streams
        self._snapshots = snapshots

    def __getitem__(self, stream: int) -> PackedSnapshot:
        return PackedSnapshot(self._stored().blob(stream), None)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._streams))

    def __len__(self) -> int:
        return self._streams

    def __contains__(self, stream: object) -> bool:
        return isinstance(stream, int) and 0 <= stream < self._streams

    def __reduce__(self) -> tuple:
        return PackedStreams, (self.path, self.end, self._streams)

    def _stored(self) -> StoredSnapshots:
        if self._snapshots is None:
            try:
                window = open_window(Path(self.path))
            except OSError as e:
                raise PlanStoreError(
                    f"balance plan store: {self.path} holds the streams' snapshots of a step "
                    f"this loader delivered and cannot be read now ({e}); was it removed?"
                ) from e
            self._snapshots = window.end if self.end else window.start
        return self._snapshots
