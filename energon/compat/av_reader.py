"""``megatron.energon.av.av_reader``: the reference's ``AVProbeIndex`` (constructed from an open
container; ``len()`` frames; ``index[i]`` is an ``AVProbeIndexEntry``) over energon's index."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.av import index as core

__all__ = ["AVProbeIndex", "AVProbeIndexEntry"]


@dataclasses.dataclass
class AVProbeIndexEntry:
    timestamp: int
    is_keyframe: bool


class AVProbeIndex:
    """Every frame's timestamp (display order) of one stream, found by demuxing."""

    def __init__(self, container: Any, stream_idx: int = 0) -> None:
        self._index = core.AVProbeIndex.build(container, stream_idx)
        keyframes = set(self._index.keyframe_pts)
        self._entries = [AVProbeIndexEntry(ts, ts in keyframes) for ts in self._index.frame_pts]

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, idx: int) -> AVProbeIndexEntry:
        return self._entries[idx]

    def search_timestamp(
        self, timestamp: int, *, backward: bool = True, any_frame: bool = False
    ) -> int:
        """Index of the keyframe (or, with ``any_frame``, the frame) nearest ``timestamp``, at or
        before it (``backward``) or at or after it."""
        return self._index.search_timestamp(timestamp, backward=backward, any_frame=any_frame)
