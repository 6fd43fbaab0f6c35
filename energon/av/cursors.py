"""Stream cursors: decode one stream of an open container forward from a seek.

A cursor remembers where it is between the requests of one call, so clips close together are
decoded on instead of seeking back to a keyframe and decoding the same frames again. After every
seek it checks that it landed at or before the wanted time and steps back if not (containers
without a trustworthy timestamp index are seeked by their probed keyframe table, see
:mod:`energon.av.index`). The frame loops check the call's deadline after every frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from energon.av.frames import audio_frame_to_array
from energon.av.header import StreamFacts
from energon.av.index import AVProbeIndex
from energon.deadline import check_deadline

#: How many times to step further back when a seek lands after the wanted time.
SEEK_RETRIES = 4


@dataclass
class TimedFrame:
    frame: Any
    pts: float  # in stream time_base units


class VideoCursor:
    """Decodes one video stream forward from its last seek.

    Keeps the last frame handed out (a following request may start inside it) and one frame of
    look-ahead (it tells where the previous frame ends). Consecutive requests close together reuse
    the position instead of seeking back to a keyframe and decoding the same frames again.
    """

    def __init__(
        self,
        container: Any,
        facts: StreamFacts,
        index: AVProbeIndex | None,
        reuse_window_seconds: float,
        warn: Callable[[str], None],
    ) -> None:
        """``index``: the stream's probed keyframe table, for containers whose own timestamp
        seeking cannot be trusted (None: seek by timestamp). ``reuse_window_seconds``: without
        an index, a request starting at most this far ahead decodes on instead of seeking."""
        self.container = container
        self.stream = container.streams[facts.index]
        self.facts = facts
        self.index = index
        self.reuse_pts = reuse_window_seconds / facts.time_base
        self.step_pts = float(1 / (facts.rate * facts.time_base)) if facts.rate else 1.0
        self.warn = warn
        self.frames: Iterator[Any] | None = None
        self.last: TimedFrame | None = None
        self.lookahead: TimedFrame | None = None

    def _next(self) -> TimedFrame | None:
        if self.lookahead is not None:
            item, self.lookahead = self.lookahead, None
            return item
        assert self.frames is not None
        for frame in self.frames:
            check_deadline()
            pts = frame.pts
            if pts is None:  # some demuxers (raw streams) give no timestamps: extrapolate
                self.warn("video frames without timestamps: times assume a constant frame rate")
                pts = self.last.pts + self.step_pts if self.last is not None else 0
            return TimedFrame(frame, float(pts))
        return None

    def _position(self) -> float | None:
        if self.lookahead is not None:
            return self.lookahead.pts
        return self.last.pts if self.last is not None else None

    def _can_continue_to(self, start: float) -> bool:
        """Decoding on from here reaches ``start`` at least as cheaply as seeking would."""
        if self.frames is None or self.last is None or self.last.pts > start:
            return False
        position = self._position()
        assert position is not None
        if self.index is not None:
            return not self.index.has_keyframe_between(position, start)
        return start - position <= self.reuse_pts

    def _seek(self, target: float) -> None:
        self.container.seek(
            max(0, int(math.floor(target))), backward=True, any_frame=False, stream=self.stream
        )
        self.frames = self.container.decode(self.stream)
        self.last = None
        self.lookahead = None

    def _rewind_to_start(self) -> None:
        self.container.seek(0)
        self.frames = self.container.decode(self.stream)
        self.last = None
        self.lookahead = None

    def position_before(self, start: float) -> None:
        """Make the next decoded frame one at or before ``start`` (unless ``start`` precedes the
        first frame), by continuing, or seeking to a keyframe and stepping back if it overshot."""
        if self._can_continue_to(start):
            return
        target = start
        if self.index is not None:
            keyframe = self.index.keyframe_at_or_before(start)
            target = keyframe if keyframe is not None else 0
        back_off = max(self.step_pts, 1 / self.facts.time_base)  # one second, then doubling
        for _ in range(SEEK_RETRIES):
            if target <= self.facts.start_pts:
                break
            self._seek(target)
            first = self._next()
            if first is None or first.pts <= start:
                self.lookahead = first
                return
            target -= back_off
            back_off *= 2
        self._rewind_to_start()

    def range_to_pts(self, start: float, end: float, unit: str) -> tuple[float, float] | None:
        """A requested range in ``unit`` ("seconds", or "frames": needs the probed ``index``) as
        a pts range for :meth:`clip`; None if it starts after the last frame."""
        if unit == "seconds":
            return start / self.facts.time_base, end / self.facts.time_base
        frame_pts = self.index.frame_pts  # type: ignore[union-attr]
        first = max(0, math.ceil(start))
        if first >= len(frame_pts):
            return None
        last = len(frame_pts) - 1 if math.isinf(end) else min(int(end), len(frame_pts) - 1)
        return float(frame_pts[first]), float(frame_pts[max(first, last)])

    def clip(
        self, start: float, end: float, convert: Callable[[Any], np.ndarray]
    ) -> tuple[list[np.ndarray], float, float] | None:
        """Frames covering ``[start, end]`` (pts units): the frame showing at ``start`` and every
        frame starting up to ``end``, each passed through ``convert`` as soon as it is chosen (so
        decoded frames are not held); with the clip's start and end pts. None if past the end."""
        self.position_before(start)
        covering = self.last if self.last is not None and self.last.pts <= start else None
        chosen: list[np.ndarray] = []
        first_item = last_chosen = None
        while True:
            item = self._next()
            if item is None:
                break
            if item.pts <= start:
                covering = item
                self.last = item
                continue
            if not chosen and covering is not None:
                chosen.append(convert(covering.frame))
                first_item = last_chosen = covering
            if item.pts > end:
                self.lookahead = item
                break
            chosen.append(convert(item.frame))
            if first_item is None:
                first_item = item
            last_chosen = self.last = item
        if not chosen:
            return self._clip_from_last_frame(covering, start, convert)
        assert first_item is not None and last_chosen is not None
        end_pts = self.lookahead.pts if self.lookahead is not None else self._frame_end(last_chosen)
        return chosen, first_item.pts, end_pts

    def _clip_from_last_frame(
        self, covering: TimedFrame | None, start: float, convert: Callable[[Any], np.ndarray]
    ) -> tuple[list[np.ndarray], float, float] | None:
        """At the end of the stream: the last frame still counts if ``start`` lies inside it."""
        if covering is None:
            return None
        frame_end = self._frame_end(covering)
        if start >= frame_end:
            return None
        return [convert(covering.frame)], covering.pts, frame_end

    def _frame_end(self, item: TimedFrame) -> float:
        duration = getattr(item.frame, "duration", None)
        if self.index is not None and item.pts >= self.index.frame_pts[-1]:
            return float(self.index.end_pts)
        return item.pts + (duration if duration else self.step_pts)


class AudioCursor:
    """Decodes one audio stream forward, tracking each frame's first sample index.

    Sample 0 is the first sample of the stream (its ``start_time``): MP3 and Opus streams start
    a few milliseconds "late" to hide encoder delay, and users expect ``(0, 1)`` to give the first
    second of what a player would play. Positions after a seek continue by sample counts, so
    clips are gapless and exact even where timestamps are rounded (e.g. millisecond time bases).
    """

    def __init__(self, container: Any, facts: StreamFacts, reuse_window_seconds: float) -> None:
        assert facts.rate is not None
        self.container = container
        self.stream = container.streams[facts.index]
        self.facts = facts
        self.rate = int(facts.rate)
        self.reuse_samples = reuse_window_seconds * self.rate
        self.frames: Iterator[Any] | None = None
        self.next_sample: int | None = None  # first sample of the next frame (continuity)
        self.last: tuple[int, np.ndarray] | None = None  # (first sample, data) of the last frame

    def _sample_of(self, frame: Any) -> int:
        if self.next_sample is not None:
            return self.next_sample
        if frame.pts is None:
            return 0
        return round((frame.pts - self.facts.start_pts) * self.facts.time_base * self.rate)

    def _next(self) -> tuple[int, np.ndarray] | None:
        assert self.frames is not None
        for frame in self.frames:
            check_deadline()
            first = self._sample_of(frame)
            data = audio_frame_to_array(frame)
            self.next_sample = first + data.shape[1]
            self.last = (first, data)
            return self.last
        return None

    def _seek(self, sample: float) -> None:
        target = int(sample / self.rate / self.facts.time_base) + self.facts.start_pts
        if target <= self.facts.start_pts:
            self.container.seek(0)
        else:
            self.container.seek(target, backward=True, any_frame=False, stream=self.stream)
        self.frames = self.container.decode(self.stream)
        self.next_sample = None
        self.last = None

    def _position_before(self, start: int) -> tuple[int, np.ndarray] | None:
        """The decoded frame containing (or first after) sample ``start``."""
        if (
            self.frames is not None
            and self.last is not None
            and self.last[0] <= start
            and start - self.last[0] <= self.reuse_samples
        ):
            return self.last
        target = float(start)
        back_off = float(self.rate)
        for _ in range(SEEK_RETRIES):
            self._seek(target)
            first = self._next()
            if first is None or first[0] <= start or target <= 0:
                return first
            target = max(0.0, target - back_off)
            back_off *= 2
        self._seek(0)
        return self._next()

    def clip(self, start: int, count: int | None) -> tuple[np.ndarray, int] | None:
        """Samples ``[start, start + count)`` (``count=None``: to the end) and the index of the
        first returned sample; None if ``start`` lies beyond the end of the stream."""
        current = self._position_before(start)
        pieces: list[np.ndarray] = []
        first_returned: int | None = None
        stop = None if count is None else start + count
        while current is not None:
            frame_start, data = current
            lo = max(start, frame_start) - frame_start
            hi = data.shape[1] if stop is None else min(data.shape[1], stop - frame_start)
            if hi > lo:
                if first_returned is None:
                    first_returned = frame_start + lo
                pieces.append(data[:, lo:hi])
            if stop is not None and frame_start + data.shape[1] >= stop:
                break
            current = self._next()
        if first_returned is None:
            return None
        return np.concatenate(pieces, axis=1), first_returned
