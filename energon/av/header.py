"""What the container's header says about its streams, read once per decoder.

:class:`Header` holds the facts :class:`~energon.av.decoder.AVDecoder` answers questions from
without decoding (rates, durations, sizes) and tells whether the container's own timestamp
seeking can be trusted (``needs_probe``: see :mod:`energon.av.index`). PCM WAV files get their
header from :mod:`energon.av.wav` without FFmpeg.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from energon.av.wav import PcmWav

#: Containers whose own timestamp seeking is reliable; everything else is probed.
SEEKABLE_FORMATS = ("mov", "mp4", "matroska", "webm", "ogg", "flac", "mp3", "wav")


@dataclass(frozen=True)
class StreamFacts:
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
class Header:
    format_name: str
    duration_seconds: float | None  # of the whole container
    video: StreamFacts | None
    audio: StreamFacts | None

    @property
    def needs_probe(self) -> bool:
        names = self.format_name.split(",")
        return not any(name in SEEKABLE_FORMATS for name in names)


def _is_attached_picture(stream: Any) -> bool:
    """Cover art in audio files shows up as a one-frame video stream; it is not a video."""
    try:
        return bool(int(stream.disposition) & 1024)  # AV_DISPOSITION_ATTACHED_PIC
    except (AttributeError, TypeError, ValueError):
        return False


def _video_facts(stream: Any) -> StreamFacts:
    context = stream.codec_context
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return StreamFacts(
        index=stream.index,
        time_base=stream.time_base or Fraction(1, 1_000_000),
        start_pts=stream.start_time or 0,
        duration_pts=stream.duration,
        frames=stream.frames or 0,
        rate=Fraction(rate) if rate else None,
        width=context.width or 0,
        height=context.height or 0,
    )


def _audio_facts(stream: Any) -> StreamFacts:
    context = stream.codec_context
    return StreamFacts(
        index=stream.index,
        time_base=stream.time_base or Fraction(1, context.sample_rate or 1),
        start_pts=stream.start_time or 0,
        duration_pts=stream.duration,
        frames=stream.frames or 0,
        rate=Fraction(context.sample_rate) if context.sample_rate else None,
        channels=context.channels or 0,
    )


def read_header(container: Any) -> Header:
    video = next((s for s in container.streams.video if not _is_attached_picture(s)), None)
    audio = next(iter(container.streams.audio), None)
    return Header(
        format_name=container.format.name,
        duration_seconds=container.duration / 1_000_000 if container.duration else None,
        video=_video_facts(video) if video is not None else None,
        audio=_audio_facts(audio) if audio is not None else None,
    )


def wav_header(wav: PcmWav) -> Header:
    facts = StreamFacts(
        index=0,
        time_base=Fraction(1, wav.sample_rate),
        start_pts=0,
        duration_pts=wav.num_samples,
        frames=0,
        rate=Fraction(wav.sample_rate),
        channels=wav.channels,
    )
    return Header("wav", wav.duration, None, facts)
