"""A stream's packet table, built by demuxing (reading packet headers, decoding nothing).

Some containers cannot be trusted to seek by timestamp (AVI stores no presentation times in its
index, raw streams have no index at all), and frame numbers can only be mapped to times exactly
by knowing every frame's timestamp (variable frame rate). Demuxing is cheap compared to decoding
(a 60 s, 30 fps video demuxes in a few milliseconds and decodes in hundreds), so the table is built
once per decoder when needed and then answers: which keyframe to seek to for a time, the time of
frame N, the number of frames, and the stream's exact duration.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

__all__ = ["AVProbeIndex"]


@dataclass
class AVProbeIndex:
    """Packet timestamps of one stream (in its ``time_base`` units).

    ``frame_pts``: presentation timestamps sorted ascending (= display order, one per frame);
    ``keyframe_pts``: sorted timestamps of keyframes; ``end_pts``: the end of the last frame.
    """

    frame_pts: list[int]
    keyframe_pts: list[int]
    end_pts: int

    @classmethod
    def build(cls, container: Any, stream_index: int) -> AVProbeIndex:
        """Demux every packet of stream ``stream_index`` of an open container."""
        stream = container.streams[stream_index]
        frame_pts: list[int] = []
        keyframes: list[int] = []
        end = None
        for packet in container.demux(stream):
            ts = packet.pts if packet.pts is not None else packet.dts
            if ts is None or packet.size == 0:  # flush packets carry no data
                continue
            frame_pts.append(ts)
            if packet.is_keyframe:
                keyframes.append(ts)
            packet_end = ts + (packet.duration or 0)
            end = packet_end if end is None else max(end, packet_end)
        frame_pts.sort()
        keyframes.sort()
        if frame_pts and end is not None and end <= frame_pts[-1]:
            end = frame_pts[-1] + _typical_step(frame_pts)
        return cls(frame_pts, keyframes, end if end is not None else 0)

    @property
    def entries(self) -> list[tuple[int, bool]]:
        """``(timestamp, is_keyframe)`` per frame, in display order."""
        keys = set(self.keyframe_pts)
        return [(ts, ts in keys) for ts in self.frame_pts]

    @property
    def num_frames(self) -> int:
        return len(self.frame_pts)

    def search_timestamp(self, ts: float, backward: bool = True, any_frame: bool = False) -> int:
        """Index (into the frames, or into the keyframes unless ``any_frame``) of the nearest entry
        at/before ``ts`` (``backward``) or at/after it; clamped to the valid range."""
        table = self.frame_pts if any_frame else self.keyframe_pts
        if not table:
            return 0
        if backward:
            return max(0, bisect.bisect_right(table, ts) - 1)
        return min(len(table) - 1, bisect.bisect_left(table, ts))

    def keyframe_at_or_before(self, ts: float) -> int | None:
        """Timestamp of the last keyframe at/before ``ts`` (None if there is no keyframe)."""
        if not self.keyframe_pts:
            return None
        return self.keyframe_pts[self.search_timestamp(ts)]

    def has_keyframe_between(self, after: float, up_to: float) -> bool:
        """Whether a keyframe lies in ``(after, up_to]``: then seeking beats decoding onwards."""
        i = bisect.bisect_right(self.keyframe_pts, after)
        return i < len(self.keyframe_pts) and self.keyframe_pts[i] <= up_to


def _typical_step(sorted_pts: list[int]) -> int:
    if len(sorted_pts) < 2:
        return 1
    return max(1, sorted_pts[-1] - sorted_pts[-2])
