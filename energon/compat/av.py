"""``megatron.energon.av`` (and ``.av_data``, ``.av_decoder``, ``.utils``, ``.av_init``): energon's
audio/video decoding (:mod:`energon.av`) under the reference's names, plus its helpers for opening
PyAV containers and its webdataset-style decoder callable."""

from __future__ import annotations

import enum
from typing import Any, Literal

from energon.av import AVData, AVDecoder, AVProbeIndex, get_clips_uniform, get_single_frames_uniform
from energon.format.media_metadata import AVMetadata
from energon.samples.edataclass import edataclass

__path__: list[str] = []  # a package for the alias: av.* map here (av.av_reader: compat.av_reader)

__all__ = [
    "AV_DECODE_AVAILABLE",
    "AVData",
    "AVDecoder",
    "AVIndexMode",
    "AVMetadata",
    "AVProbeIndex",
    "AVWebdatasetDecoder",
    "av_open",
    "edataclass",
    "get_clips_uniform",
    "get_single_frames_uniform",
    "initialize_av_container",
]

try:
    import av as _pyav  # noqa: F401

    AV_DECODE_AVAILABLE = True
except ImportError:
    AV_DECODE_AVAILABLE = False


class AVIndexMode(enum.Enum):
    """How a stream is indexed for seeking."""

    FRAMES = "frames"
    PTS = "pts"
    PROBE = "probe"


def initialize_av_container(input_container: Any) -> None:
    """Keep PyAV from starting threads of its own in ``input_container`` (no deadlocks when it
    is freed, and no threads before a data loader forks its workers)."""
    for stream in getattr(input_container, "streams", ()):
        codec_context = getattr(stream, "codec_context", None)
        if codec_context is not None:
            codec_context.thread_type = "NONE"
            codec_context.thread_count = 1


def av_open(file: Any) -> Any:
    """``av.open(file)`` with :func:`initialize_av_container` applied."""
    import av

    container = av.open(file)
    initialize_av_container(container)
    return container


class AVWebdatasetDecoder:
    """A decoder callable for audio/video parts: ``decoder(key, data)`` gives an ``AVDecoder``
    (``av_decode="AVDecoder"``) or the decoded ``AVData`` (``"torch"``)."""

    def __init__(
        self,
        video_decode_audio: bool,
        av_decode: Literal["torch", "AVDecoder", "pyav"] = "AVDecoder",
    ) -> None:
        self.video_decode_audio = video_decode_audio
        self.av_decode = av_decode

    def read_av_data(self, data: bytes) -> AVDecoder:
        """A lazy decoder over the media bytes."""
        return AVDecoder(data)

    def __call__(self, key: str, data: bytes) -> Any:
        decoder = self.read_av_data(data)
        if self.av_decode == "AVDecoder":
            return decoder
        if self.av_decode == "pyav":
            return av_open(__import__("io").BytesIO(data))
        if self.video_decode_audio:
            return decoder.get_video_with_audio()
        return decoder.get_video() if decoder.has_video_stream() else decoder.get_audio()
