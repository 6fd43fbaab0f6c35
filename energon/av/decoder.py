"""``AVDecoder``: a lazy handle on one audio/video file held in memory.

A dataset's video part is decoded to this handle, not to frames: training code usually needs a
few clips or frames of a long video, and decoding all of it would cost orders of magnitude more.
The handle keeps only the encoded bytes (so it is cheap to create and to pickle), and each request
opens the container, seeks to the nearest keyframe at or before the wanted time and decodes only
from there.

Timing follows each frame's own presentation timestamp, so variable frame rate videos are exact.
Containers whose timestamp seeking cannot be trusted (AVI and other formats without a
presentation-time index) get a keyframe table built by demuxing once (see ``index.py``); after
every seek the decoder checks that it landed at or before the wanted time and steps back if not.

Every public method reports failures as :class:`AVDecodeError` (a ``SampleException``, handled by
the loader's error policy) and runs under ``timeout`` seconds if one was given (see
``energon.deadline``; the frame loops check the deadline after every frame).
"""

from __future__ import annotations

import functools
import io
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, BinaryIO, Literal, TypeVar

import numpy as np
import torch

from energon.av._pyav import DEFAULT_CODEC_THREADS, new_video_reformatter, open_container
from energon.av.data import AVData
from energon.av.errors import AVDecodeError
from energon.av.index import AVProbeIndex
from energon.av.wav import PcmWav, parse_pcm_wav
from energon.deadline import DecodeTimeoutError, check_deadline, deadline
from energon.errors import SYSTEM_EXCEPTIONS, EnergonError
from energon.format.media_metadata import AVMetadata

__all__ = ["AVDecoder"]

VideoUnit = Literal["seconds", "frames"]
AudioUnit = Literal["seconds", "samples"]
ClipRange = tuple[float, float]

#: Containers whose own timestamp seeking is reliable; everything else is probed (see module doc).
_SEEKABLE_FORMATS = ("mov", "mp4", "matroska", "webm", "ogg", "flac", "mp3", "wav")
#: How many times to step further back when a seek lands after the wanted time.
_SEEK_RETRIES = 4

F = TypeVar("F", bound=Callable[..., Any])


class _BadRequest(EnergonError, ValueError):
    """The caller asked for something invalid (a programming error, not a broken sample)."""


# ---------------------------------------------------------------------------------------------
# Header facts, read once per decoder


@dataclass(frozen=True)
class _StreamFacts:
    index: int
    time_base: Fraction
    start_pts: int  # stream start in time_base units (0 when unknown)
    duration_pts: int | None  # from the header; None when the container does not say
    frames: int  # from the header; 0 when unknown
    rate: Fraction | None  # video: average frame rate; audio: sample rate
    width: int = 0
    height: int = 0
    channels: int = 0


@dataclass(frozen=True)
class _Header:
    format_name: str
    duration_seconds: float | None  # of the whole container
    video: _StreamFacts | None
    audio: _StreamFacts | None

    @property
    def needs_probe(self) -> bool:
        names = self.format_name.split(",")
        return not any(name in _SEEKABLE_FORMATS for name in names)


def _is_attached_picture(stream: Any) -> bool:
    """Cover art in audio files shows up as a one-frame video stream; it is not a video."""
    try:
        return bool(int(stream.disposition) & 1024)  # AV_DISPOSITION_ATTACHED_PIC
    except (AttributeError, TypeError, ValueError):
        return False


def _video_facts(stream: Any) -> _StreamFacts:
    context = stream.codec_context
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return _StreamFacts(
        index=stream.index,
        time_base=stream.time_base or Fraction(1, 1_000_000),
        start_pts=stream.start_time or 0,
        duration_pts=stream.duration,
        frames=stream.frames or 0,
        rate=Fraction(rate) if rate else None,
        width=context.width or 0,
        height=context.height or 0,
    )


def _audio_facts(stream: Any) -> _StreamFacts:
    context = stream.codec_context
    return _StreamFacts(
        index=stream.index,
        time_base=stream.time_base or Fraction(1, context.sample_rate or 1),
        start_pts=stream.start_time or 0,
        duration_pts=stream.duration,
        frames=stream.frames or 0,
        rate=Fraction(context.sample_rate) if context.sample_rate else None,
        channels=context.channels or 0,
    )


def _read_header(container: Any) -> _Header:
    video = next((s for s in container.streams.video if not _is_attached_picture(s)), None)
    audio = next(iter(container.streams.audio), None)
    return _Header(
        format_name=container.format.name,
        duration_seconds=container.duration / 1_000_000 if container.duration else None,
        video=_video_facts(video) if video is not None else None,
        audio=_audio_facts(audio) if audio is not None else None,
    )


def _wav_header(wav: PcmWav) -> _Header:
    facts = _StreamFacts(
        index=0,
        time_base=Fraction(1, wav.sample_rate),
        start_pts=0,
        duration_pts=wav.num_samples,
        frames=0,
        rate=Fraction(wav.sample_rate),
        channels=wav.channels,
    )
    return _Header("wav", wav.duration, None, facts)


# ---------------------------------------------------------------------------------------------
# Error translation + deadline for every public method


def _av_operation(name: str) -> Callable[[F], F]:
    """Run a public method under the decoder's timeout and report failures as AVDecodeError."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: AVDecoder, *args: Any, **kwargs: Any) -> Any:
            what = f"AVDecoder.{name} of {self.name}"
            with deadline(self.timeout, what):
                try:
                    return method(self, *args, **kwargs)
                except (AVDecodeError, DecodeTimeoutError):
                    raise
                except _BadRequest as e:
                    raise ValueError(f"{what}: {e}") from None
                except SYSTEM_EXCEPTIONS:
                    raise
                except Exception as e:
                    raise AVDecodeError(f"{what} failed: {type(e).__name__}: {e}") from e

        return run  # type: ignore[return-value]

    return wrap


# ---------------------------------------------------------------------------------------------
# Frame conversion


def _video_frame_to_array(
    frame: Any, size: tuple[int, int] | None, reformatter: Any = None
) -> np.ndarray:
    """RGB (H, W, 3) uint8, resized to ``size`` = (width, height) if given.

    ``reformatter``: a PyAV ``VideoReformatter`` shared by the frames of one request. Each
    frame's own ``to_ndarray`` sets up a new swscale context, which for small frames costs
    more than the conversion itself; a shared one is set up once (same pixels).
    """
    if reformatter is None:
        if size is not None:
            frame = frame.reformat(
                width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
            )
        return frame.to_ndarray(format="rgb24")
    if size is None:
        return reformatter.reformat(frame, format="rgb24").to_ndarray()
    return reformatter.reformat(
        frame, width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
    ).to_ndarray()


def _arrays_to_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    """(F, 3, H, W) uint8 from (H, W, 3) RGB arrays.

    Each frame is copied once, transposed, into the output with numpy: torch's ``permute`` +
    ``contiguous`` would copy through torch's intra-op thread pool, which costs far more than
    the copy itself for small frames on a busy machine (and a ``np.stack`` first would copy
    twice).
    """
    height, width, channels = arrays[0].shape
    out = np.empty((len(arrays), channels, height, width), dtype=arrays[0].dtype)
    for i, array in enumerate(arrays):
        out[i] = array.transpose(2, 0, 1)
    return torch.from_numpy(out)


def _audio_frame_to_array(frame: Any) -> np.ndarray:
    """(channels, samples) in the decoded sample format (planar or interleaved)."""
    array = frame.to_ndarray()
    if frame.format.is_planar:
        return array
    channels = len(frame.layout.channels)
    return array.reshape(-1, channels).T


# ---------------------------------------------------------------------------------------------
# Video: decode forward from a seek, remembering the position between requests


@dataclass
class _TimedFrame:
    frame: Any
    pts: float  # in stream time_base units


class _VideoCursor:
    """Decodes one video stream forward from its last seek.

    Keeps the last frame handed out (a following request may start inside it) and one frame of
    look-ahead (it tells where the previous frame ends). Consecutive requests close together reuse
    the position instead of seeking back to a keyframe and decoding the same frames again.
    """

    def __init__(self, decoder: AVDecoder, container: Any, facts: _StreamFacts) -> None:
        self.container = container
        self.stream = container.streams[facts.index]
        self.facts = facts
        self.index = decoder._probe_index(container, facts) if decoder._needs_probe else None
        self.reuse_pts = decoder.reuse_window_seconds / facts.time_base
        self.step_pts = float(1 / (facts.rate * facts.time_base)) if facts.rate else 1.0
        self.warn = decoder._warn
        self.frames: Iterator[Any] | None = None
        self.last: _TimedFrame | None = None
        self.lookahead: _TimedFrame | None = None

    def _next(self) -> _TimedFrame | None:
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
            return _TimedFrame(frame, float(pts))
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
        for _ in range(_SEEK_RETRIES):
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
        self, covering: _TimedFrame | None, start: float, convert: Callable[[Any], np.ndarray]
    ) -> tuple[list[np.ndarray], float, float] | None:
        """At the end of the stream: the last frame still counts if ``start`` lies inside it."""
        if covering is None:
            return None
        frame_end = self._frame_end(covering)
        if start >= frame_end:
            return None
        return [convert(covering.frame)], covering.pts, frame_end

    def _frame_end(self, item: _TimedFrame) -> float:
        duration = getattr(item.frame, "duration", None)
        if self.index is not None and item.pts >= self.index.frame_pts[-1]:
            return float(self.index.end_pts)
        return item.pts + (duration if duration else self.step_pts)


# ---------------------------------------------------------------------------------------------
# Audio: sample-exact clips


class _AudioCursor:
    """Decodes one audio stream forward, tracking each frame's first sample index.

    Sample 0 is the first sample of the stream (its ``start_time``): MP3 and Opus streams start
    a few milliseconds "late" to hide encoder delay, and users expect ``(0, 1)`` to give the first
    second of what a player would play. Positions after a seek continue by sample counts, so
    clips are gapless and exact even where timestamps are rounded (e.g. millisecond time bases).
    """

    def __init__(self, decoder: AVDecoder, container: Any, facts: _StreamFacts) -> None:
        assert facts.rate is not None
        self.container = container
        self.stream = container.streams[facts.index]
        self.facts = facts
        self.rate = int(facts.rate)
        self.reuse_samples = decoder.reuse_window_seconds * self.rate
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
            data = _audio_frame_to_array(frame)
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
        for _ in range(_SEEK_RETRIES):
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


# ---------------------------------------------------------------------------------------------
# The public handle


def _as_bytes(stream_or_bytes: bytes | bytearray | memoryview | BinaryIO) -> bytes:
    if isinstance(stream_or_bytes, bytes):
        return stream_or_bytes
    if isinstance(stream_or_bytes, (bytearray, memoryview)):
        return bytes(stream_or_bytes)
    if isinstance(stream_or_bytes, io.BytesIO):
        return stream_or_bytes.getvalue()
    if isinstance(stream_or_bytes, io.TextIOBase):
        raise TypeError("AVDecoder needs a binary stream or bytes, got a text stream")
    if hasattr(stream_or_bytes, "read"):
        data = stream_or_bytes.read()
        if not isinstance(data, bytes):
            raise TypeError(f"AVDecoder needs a binary stream; read() gave {type(data).__name__}")
        return data
    raise TypeError(f"AVDecoder needs bytes or a binary stream, got {type(stream_or_bytes)}")


class AVDecoder:
    """Lazy decoder of one audio/video file held in memory.

    ``stream``: the encoded file (a binary stream or bytes, read completely; the reference's name).
    ``suppress_warnings``: do not warn when frame/second conversions may be approximate.
    ``timeout``: seconds each public call may take (None: unbounded); exceeding it raises
    ``energon.deadline.DecodeTimeoutError``.
    ``codec_threads``: FFmpeg threads per codec (default ``ENERGON_AV_CODEC_THREADS`` or 1).
    ``name``: how errors name the media (the sample decoder passes ``"<key>.<part>"``).
    ``reuse_window_seconds``: a request starting at most this far after the previous one decodes on
    instead of seeking (for containers without a probed keyframe table).
    """

    def __init__(
        self,
        stream: bytes | bytearray | memoryview | BinaryIO,
        suppress_warnings: bool = False,
        *,
        timeout: float | None = None,
        codec_threads: int | None = None,
        name: str = "media",
        reuse_window_seconds: float = 1.0,
    ) -> None:
        self._data = _as_bytes(stream)
        self.suppress_warnings = suppress_warnings
        self.timeout = timeout
        self.codec_threads = codec_threads if codec_threads is not None else DEFAULT_CODEC_THREADS
        self.name = name
        self.reuse_window_seconds = reuse_window_seconds
        self._wav: PcmWav | None = parse_pcm_wav(self._data)
        self._header: _Header | None = _wav_header(self._wav) if self._wav is not None else None
        self._indices: dict[int, AVProbeIndex] = {}
        self._unused: Any = None  # the container opened to read the header, not yet decoded from

    def __getstate__(self) -> dict[str, Any]:
        """Pickles (and copies) carry the bytes and facts, never an open container."""
        state = self.__dict__.copy()
        state["_unused"] = None
        return state

    def __repr__(self) -> str:
        return f"AVDecoder({self.name}, {len(self._data)} bytes)"

    @property
    def data(self) -> bytes:
        """The encoded bytes."""
        return self._data

    # -- opening ---------------------------------------------------------------------------

    def _open(self) -> Any:
        container = open_container(self._data, self.codec_threads)
        if self._header is None:
            self._header = _read_header(container)
        return container

    def _facts(self) -> _Header:
        """The header facts. Reading them opens the container, which is kept (not decoded from)
        for the next request: the sample decoder's ``check`` at load time is followed by the task
        encoder's clip request, and opening twice would cost about a tenth of a small clip's
        decode. ``_opened`` takes it over and closes it."""
        if self._header is None:
            if self._unused is not None:
                self._unused.close()
            self._unused = self._open()
        assert self._header is not None
        return self._header

    @property
    def _needs_probe(self) -> bool:
        return self._facts().needs_probe

    def _probe_index(self, container: Any, facts: _StreamFacts) -> AVProbeIndex:
        """The packet table of a stream, demuxed once per decoder (the container is rewound)."""
        index = self._indices.get(facts.index)
        if index is None:
            index = self._indices[facts.index] = AVProbeIndex.build(container, facts.index)
            container.seek(0)
        return index

    @_av_operation("check")
    def check(self) -> None:
        """Open the container and verify it has an audio or video stream (cheap: headers only).

        The sample decoder calls this so that unreadable media is reported while loading, with
        the sample's shard and offset, rather than later inside user code.
        """
        header = self._facts()
        if header.video is None and header.audio is None:
            raise AVDecodeError(f"{self.name}: no audio or video stream found")

    # -- stream facts ----------------------------------------------------------------------

    @_av_operation("has_video_stream")
    def has_video_stream(self) -> bool:
        return self._facts().video is not None

    @_av_operation("has_audio_stream")
    def has_audio_stream(self) -> bool:
        return self._facts().audio is not None

    def _video_facts(self) -> _StreamFacts:
        facts = self._facts().video
        if facts is None:
            raise AVDecodeError(f"{self.name}: has no video stream")
        return facts

    def _audio_facts(self) -> _StreamFacts:
        facts = self._facts().audio
        if facts is None or facts.rate is None:
            raise AVDecodeError(f"{self.name}: has no audio stream")
        return facts

    @_av_operation("get_video_fps")
    def get_video_fps(self) -> float:
        """Average frames per second (from the header; else frames / duration)."""
        facts = self._video_facts()
        if facts.rate:
            return float(facts.rate)
        seconds, frames = self._video_duration(get_frame_count=True)
        return frames / seconds if seconds and frames else 0.0

    @_av_operation("get_audio_samples_per_second")
    def get_audio_samples_per_second(self) -> int:
        return int(self._audio_facts().rate)  # type: ignore[arg-type]

    @_av_operation("get_video_duration")
    def get_video_duration(self, get_frame_count: bool = False) -> tuple[float, int | None]:
        """(seconds, number of frames if ``get_frame_count`` else None)."""
        return self._video_duration(get_frame_count)

    def _video_duration(self, get_frame_count: bool) -> tuple[float, int | None]:
        """Duration from the header (else demuxed); the frame count from the header only where it
        can be trusted: containers that need probing (e.g. AVI) count dropped (empty) frames in
        their header, so there the count is that of the decodable frames, demuxed."""
        facts = self._video_facts()
        index = None
        count_frames = get_frame_count and (not facts.frames or self._needs_probe)
        if facts.duration_pts is None or count_frames:
            with self._opened() as container:
                index = self._probe_index(container, facts)
        if facts.duration_pts is not None:
            seconds = float(facts.duration_pts * facts.time_base)
        else:
            assert index is not None
            seconds = float((index.end_pts - facts.start_pts) * facts.time_base)
        frames = None
        if get_frame_count:
            frames = index.num_frames if index is not None else facts.frames
        return seconds, frames

    @_av_operation("get_audio_duration")
    def get_audio_duration(self) -> float:
        facts = self._audio_facts()
        if facts.duration_pts is not None:
            return float(facts.duration_pts * facts.time_base)
        with self._opened() as container:
            index = self._probe_index(container, facts)
        return float((index.end_pts - facts.start_pts) * facts.time_base)

    @contextmanager
    def _opened(self) -> Iterator[Any]:
        """A freshly opened container (the one kept from reading the header, if any), closed
        afterwards. The kept one is taken with ``dict.pop`` (one atomic step) so that two threads
        sharing a decoder never use the same container."""
        container = self.__dict__.pop("_unused", None)
        self._unused = None
        if container is None:
            container = self._open()
        try:
            yield container
        finally:
            container.close()

    # -- clips -----------------------------------------------------------------------------

    @_av_operation("get_video_clips")
    def get_video_clips(
        self,
        video_clip_ranges: Sequence[ClipRange],
        video_unit: VideoUnit = "seconds",
        video_out_frame_size: tuple[int, int] | None = None,
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """Clips for inclusive ranges, each a uint8 tensor (frames, 3, H, W) RGB.

        Every range within the video yields at least the frame showing at its start; ranges
        starting after the end of the video yield nothing (they are left out of both lists).
        ``video_out_frame_size`` = (width, height) resizes (bilinear). Timestamps are the first
        frame's start and the last frame's end in seconds.
        """
        results = self._video_clips(video_clip_ranges, video_unit, video_out_frame_size)
        kept = [r for r in results if r is not None]
        return [clip for clip, _ in kept], [span for _, span in kept]

    def _video_clips(
        self,
        ranges: Sequence[ClipRange],
        unit: VideoUnit,
        size: tuple[int, int] | None,
    ) -> list[tuple[torch.Tensor, tuple[float, float]] | None]:
        _check_unit(unit, ("seconds", "frames"))
        size = _check_size(size)
        facts = self._video_facts()
        with self._opened() as container:
            cursor = _VideoCursor(self, container, facts)
            reformatter = new_video_reformatter()

            def convert(frame: Any) -> np.ndarray:
                return _video_frame_to_array(frame, size, reformatter)

            if unit == "frames" and cursor.index is None:
                cursor.index = self._probe_index(container, facts)
            results = []
            for start, end in _check_ranges(ranges):
                pts_range = self._video_range_to_pts(cursor, facts, start, end, unit)
                clip = cursor.clip(*pts_range, convert) if pts_range is not None else None
                if clip is None:
                    results.append(None)
                    continue
                frames, first, last = clip
                span = (float(first * facts.time_base), float(last * facts.time_base))
                results.append((_arrays_to_tensor(frames), span))
            return results

    def _video_range_to_pts(
        self, cursor: _VideoCursor, facts: _StreamFacts, start: float, end: float, unit: str
    ) -> tuple[float, float] | None:
        if unit == "seconds":
            return start / facts.time_base, end / facts.time_base
        frame_pts = cursor.index.frame_pts  # type: ignore[union-attr]
        first = max(0, math.ceil(start))
        if first >= len(frame_pts):
            return None
        last = len(frame_pts) - 1 if math.isinf(end) else min(int(end), len(frame_pts) - 1)
        return float(frame_pts[first]), float(frame_pts[max(first, last)])

    @_av_operation("get_audio_clips")
    def get_audio_clips(
        self,
        audio_clip_ranges: Sequence[ClipRange],
        audio_unit: AudioUnit = "seconds",
    ) -> tuple[list[torch.Tensor], list[tuple[float, float]]]:
        """Clips for ranges, each a tensor (channels, samples).

        ``"seconds"``: ``(start, end)`` gives exactly ``round((end - start) * rate)`` samples from
        sample ``round(start * rate)`` on (fewer only at the end of the stream), so equally long
        requests give equally shaped clips. ``"samples"``: inclusive sample indices. ``end = inf``
        reads to the end. Ranges starting after the end yield nothing (left out of both lists).
        """
        results = self._audio_clips(audio_clip_ranges, audio_unit)
        kept = [r for r in results if r is not None]
        return [clip for clip, _ in kept], [span for _, span in kept]

    def _audio_clips(
        self, ranges: Sequence[ClipRange], unit: AudioUnit
    ) -> list[tuple[torch.Tensor, tuple[float, float]] | None]:
        _check_unit(unit, ("seconds", "samples"))
        facts = self._audio_facts()
        rate = int(facts.rate)  # type: ignore[arg-type]
        requests = [_audio_request(start, end, unit, rate) for start, end in _check_ranges(ranges)]
        if self._wav is not None:
            return [self._wav_clip(first, count) for first, count in requests]
        with self._opened() as container:
            cursor = _AudioCursor(self, container, facts)
            results = []
            for first, count in requests:
                clip = cursor.clip(first, count)
                if clip is None:
                    results.append(None)
                    continue
                data, returned_first = clip
                span = (returned_first / rate, (returned_first + data.shape[1]) / rate)
                results.append((torch.from_numpy(np.ascontiguousarray(data)), span))
            return results

    def _wav_clip(
        self, first: int, count: int | None
    ) -> tuple[torch.Tensor, tuple[float, float]] | None:
        wav = self._wav
        assert wav is not None
        first = max(0, first)
        if first >= wav.num_samples:
            return None
        count = wav.num_samples - first if count is None else count
        data = wav.read(self._data, first, count)
        span = (first / wav.sample_rate, (first + data.shape[1]) / wav.sample_rate)
        return torch.from_numpy(data), span

    @_av_operation("get_clips")
    def get_clips(
        self,
        video_clip_ranges: Sequence[ClipRange] | None = None,
        audio_clip_ranges: Sequence[ClipRange] | None = None,
        video_unit: VideoUnit = "seconds",
        audio_unit: AudioUnit = "seconds",
        video_out_frame_size: tuple[int, int] | None = None,
    ) -> AVData:
        """Video and/or audio clips in one call (streams not asked for stay None)."""
        data = AVData()
        if video_clip_ranges is not None:
            clips, spans = self.get_video_clips(video_clip_ranges, video_unit, video_out_frame_size)
            data.video_clips, data.video_timestamps = clips, spans
        if audio_clip_ranges is not None:
            clips, spans = self.get_audio_clips(audio_clip_ranges, audio_unit)
            data.audio_clips, data.audio_timestamps = clips, spans
        return data

    # -- whole streams ---------------------------------------------------------------------

    def get_video(self, video_out_frame_size: tuple[int, int] | None = None) -> AVData:
        """Every frame of the video, as one clip."""
        return self.get_clips(
            video_clip_ranges=[(0, math.inf)], video_out_frame_size=video_out_frame_size
        )

    def get_audio(self) -> AVData:
        """All audio samples, as one clip."""
        return self.get_clips(audio_clip_ranges=[(0, math.inf)])

    def get_video_with_audio(self, video_out_frame_size: tuple[int, int] | None = None) -> AVData:
        return self.get_clips(
            video_clip_ranges=[(0, math.inf)],
            audio_clip_ranges=[(0, math.inf)],
            video_out_frame_size=video_out_frame_size,
        )

    @_av_operation("get_frames")
    def get_frames(self, video_decode_audio: bool = False) -> AVData | None:
        """Everything decoded: the video (and its audio if ``video_decode_audio``), or the audio of
        an audio-only file; None if there is neither."""
        if self.has_video_stream():
            if video_decode_audio and self.has_audio_stream():
                return self.get_video_with_audio()
            return self.get_video()
        if self.has_audio_stream():
            return self.get_audio()
        return None

    # -- metadata --------------------------------------------------------------------------

    @_av_operation("get_metadata")
    def get_metadata(
        self,
        get_video: bool = True,
        get_video_duration: bool = True,
        get_video_frame_count: bool = True,
        get_video_frame_size: bool = True,
        get_audio: bool = True,
        get_audio_duration: bool = True,
        get_audio_num_samples: bool = False,
    ) -> Any:
        """An ``energon.media.AVMetadata`` with what was asked for (header values where the
        container has them; durations and frame counts by demuxing otherwise; the audio sample
        count decodes the whole audio stream unless it is PCM WAV)."""
        metadata = AVMetadata()
        header = self._facts()
        if get_video and header.video is not None:
            self._fill_video_metadata(
                metadata, get_video_duration, get_video_frame_count, get_video_frame_size
            )
        if get_audio and header.audio is not None:
            self._fill_audio_metadata(metadata, get_audio_duration, get_audio_num_samples)
        return metadata

    def _fill_video_metadata(
        self, metadata: Any, duration: bool, frame_count: bool, frame_size: bool
    ) -> None:
        facts = self._video_facts()
        if duration or frame_count:
            seconds, frames = self._video_duration(get_frame_count=frame_count)
            if duration:
                metadata.video_duration = seconds
            metadata.video_num_frames = frames
        metadata.video_fps = self.get_video_fps()
        if frame_size:
            width, height = facts.width, facts.height
            if not (width and height):
                first = self.get_video_clips([(0, 0)], "frames")[0][0]
                height, width = int(first.shape[2]), int(first.shape[3])
            metadata.video_width, metadata.video_height = width, height

    def _fill_audio_metadata(self, metadata: Any, duration: bool, num_samples: bool) -> None:
        facts = self._audio_facts()
        metadata.audio_channels = facts.channels
        metadata.audio_sample_rate = int(facts.rate)  # type: ignore[arg-type]
        if duration:
            metadata.audio_duration = self.get_audio_duration()
        if num_samples:
            metadata.audio_num_samples = self._count_audio_samples()

    def _count_audio_samples(self) -> int:
        if self._wav is not None:
            return self._wav.num_samples
        facts = self._audio_facts()
        total = 0
        with self._opened() as container:
            for frame in container.decode(container.streams[facts.index]):
                check_deadline()
                total += frame.samples
        return total

    def _warn(self, message: str) -> None:
        if not self.suppress_warnings:
            warnings.warn(message, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Argument checks


def _check_unit(unit: str, allowed: tuple[str, ...]) -> None:
    if unit not in allowed:
        raise _BadRequest(f"unit must be one of {allowed}, got {unit!r}")


def _check_size(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise _BadRequest(f"video_out_frame_size must be (width, height), got {size!r}") from None
    if width <= 0 or height <= 0:
        raise _BadRequest(f"video_out_frame_size must be positive, got {size!r}")
    return width, height


def _check_ranges(ranges: Sequence[ClipRange]) -> list[tuple[float, float]]:
    checked = []
    for item in ranges:
        try:
            start, end = (float(v) for v in item)
        except (TypeError, ValueError):
            raise _BadRequest(f"a clip range must be (start, end), got {item!r}") from None
        if math.isnan(start) or math.isnan(end) or end < start:
            raise _BadRequest(f"invalid clip range {item!r}: need start <= end")
        checked.append((start, end))
    return checked


def _audio_request(start: float, end: float, unit: str, rate: int) -> tuple[int, int | None]:
    """(first sample, sample count or None for "to the end") of one audio range."""
    if unit == "samples":
        first = max(0, math.ceil(start))
        return first, None if math.isinf(end) else max(0, int(end) - first + 1)
    first = max(0, round(start * rate))
    return first, None if math.isinf(end) else round((end - max(0.0, start)) * rate)
