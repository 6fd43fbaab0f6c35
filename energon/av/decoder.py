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

The parts, each in its own module: what the header says (``header.py``), the stream cursors that
decode forward from a seek (``cursors.py``), frames as arrays and tensors (``frames.py``) and the
checks of clip requests (``clip_requests.py``); this module is the handle users hold.

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
from typing import Any, BinaryIO, TypeVar

import numpy as np
import torch

from energon.av._pyav import DEFAULT_CODEC_THREADS, new_video_reformatter, open_container
from energon.av.clip_requests import (
    AudioUnit,
    ClipRange,
    VideoUnit,
    _BadRequest,
    audio_request,
    check_ranges,
    check_size,
    check_unit,
)
from energon.av.cursors import AudioCursor, VideoCursor
from energon.av.data import AVData
from energon.av.errors import AVDecodeError
from energon.av.frames import arrays_to_tensor, video_frame_to_array
from energon.av.header import Header, StreamFacts, read_header, wav_header
from energon.av.index import AVProbeIndex
from energon.av.wav import PcmWav, parse_pcm_wav
from energon.deadline import DecodeTimeoutError, check_deadline, deadline
from energon.errors import SYSTEM_EXCEPTIONS
from energon.format.media_metadata import AVMetadata

__all__ = ["AVDecoder", "AudioUnit", "ClipRange", "VideoUnit"]

F = TypeVar("F", bound=Callable[..., Any])


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
        self._header: Header | None = wav_header(self._wav) if self._wav is not None else None
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
            self._header = read_header(container)
        return container

    def _facts(self) -> Header:
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

    def _probe_index(self, container: Any, facts: StreamFacts) -> AVProbeIndex:
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

    def _video_facts(self) -> StreamFacts:
        facts = self._facts().video
        if facts is None:
            raise AVDecodeError(f"{self.name}: has no video stream")
        return facts

    def _audio_facts(self) -> StreamFacts:
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
        check_unit(unit, ("seconds", "frames"))
        size = check_size(size)
        facts = self._video_facts()
        with self._opened() as container:
            index = self._probe_index(container, facts) if self._needs_probe else None
            cursor = VideoCursor(container, facts, index, self.reuse_window_seconds, self._warn)
            reformatter = new_video_reformatter()

            def convert(frame: Any) -> np.ndarray:
                return video_frame_to_array(frame, size, reformatter)

            if unit == "frames" and cursor.index is None:
                cursor.index = self._probe_index(container, facts)
            results = []
            for start, end in check_ranges(ranges):
                pts_range = cursor.range_to_pts(start, end, unit)
                clip = cursor.clip(*pts_range, convert) if pts_range is not None else None
                if clip is None:
                    results.append(None)
                    continue
                frames, first, last = clip
                span = (float(first * facts.time_base), float(last * facts.time_base))
                results.append((arrays_to_tensor(frames), span))
            return results

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
        check_unit(unit, ("seconds", "samples"))
        facts = self._audio_facts()
        rate = int(facts.rate)  # type: ignore[arg-type]
        requests = [audio_request(start, end, unit, rate) for start, end in check_ranges(ranges)]
        if self._wav is not None:
            wav, data = self._wav, self._data
            return [_timed_audio(wav.clip(data, first, count), rate) for first, count in requests]
        with self._opened() as container:
            cursor = AudioCursor(container, facts, self.reuse_window_seconds)
            return [_timed_audio(cursor.clip(first, count), rate) for first, count in requests]

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


def _timed_audio(
    clip: tuple[np.ndarray, int] | None, rate: int
) -> tuple[torch.Tensor, tuple[float, float]] | None:
    """An audio clip as a tensor with its span in seconds (None stays None: past the end)."""
    if clip is None:
        return None
    data, first = clip
    span = (first / rate, (first + data.shape[1]) / rate)
    return torch.from_numpy(np.ascontiguousarray(data)), span
