"""Small synthetic audio/video files made with PyAV, for the demo, the tests and the benchmarks.

The content is built to be checkable after lossy compression: every video frame shows its own frame
number in binary as black/white vertical stripes (read back with :func:`frame_number`), and audio
sample ``n`` of channel 0 is ``n % 30000`` (channel 1 is its negation), so lossless codecs can be
checked sample-exactly and clips of audio and video can be checked against each other.
Randomness (texture for realistic decoding cost) comes from a local ``numpy`` generator.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from energon.av._pyav import import_av

__all__ = [
    "AUDIO_PERIOD",
    "audio_ramp",
    "encodable",
    "encode_audio",
    "encode_video",
    "frame_number",
    "pick_codec",
    "write_tar_shards",
]

#: Audio sample ``n`` of channel 0 holds ``n % AUDIO_PERIOD``.
AUDIO_PERIOD = 30000


def encodable(codec: str) -> bool:
    """Whether the installed PyAV/FFmpeg can encode with ``codec``."""
    av = import_av()
    try:
        av.codec.Codec(codec, "w")
    except Exception:
        return False
    return True


def pick_codec(*candidates: str) -> str | None:
    """The first encodable codec of ``candidates`` (e.g. ``"libx264", "h264", "mpeg4"``)."""
    return next((c for c in candidates if encodable(c)), None)


def _bits_for(num_frames: int) -> int:
    return max(8, math.ceil(math.log2(max(2, num_frames))))


def _frame_image(
    number: int, width: int, height: int, bits: int, texture: np.ndarray | None
) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    stripe = width // bits
    stripe_rows = height if texture is None else height // 2
    for bit in range(bits):
        if (number >> bit) & 1:
            image[:stripe_rows, bit * stripe : (bit + 1) * stripe] = 255
    if texture is not None:  # a moving texture makes the codec work like on real footage
        shift = (number * 3) % texture.shape[1]
        image[stripe_rows:] = np.roll(texture, shift, axis=1)[: height - stripe_rows]
    return image


def frame_number(frame: np.ndarray, num_bits: int = 8) -> int:
    """Read the frame number back from a decoded frame, (3, H, W) or (H, W, 3) uint8."""
    if frame.shape[0] == 3 and frame.shape[-1] != 3:
        frame = frame.transpose(1, 2, 0)
    width = frame.shape[1]
    stripe = width / num_bits
    rows = frame[: max(1, frame.shape[0] // 4)]
    number = 0
    for bit in range(num_bits):
        lo, hi = int(bit * stripe + stripe / 4), int((bit + 1) * stripe - stripe / 4)
        if rows[:, lo : max(hi, lo + 1)].mean() > 127:
            number |= 1 << bit
    return number


def audio_ramp(first: int, count: int, channels: int) -> np.ndarray:
    """The synthetic audio's samples ``[first, first + count)``, (channels, count) int16."""
    ramp = (np.arange(first, first + count) % AUDIO_PERIOD).astype(np.int16)
    return np.stack([ramp if c % 2 == 0 else -ramp for c in range(channels)])


def _layout(channels: int) -> str:
    return {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")


def _write_audio(container, stream, rate: int, channels: int, seconds: float) -> None:
    av = import_av()
    total = round(rate * seconds)
    chunk = stream.codec_context.frame_size or 1024
    for first in range(0, total, chunk):
        count = min(chunk, total - first)
        frame = av.AudioFrame.from_ndarray(
            audio_ramp(first, count, channels), format="s16p", layout=_layout(channels)
        )
        frame.sample_rate = rate
        frame.pts = first
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def encode_video(
    *,
    container: str = "mp4",
    video_codec: str = "libx264",
    width: int = 64,
    height: int = 48,
    fps: int = 30,
    seconds: float = 2.0,
    audio_codec: str | None = None,
    audio_rate: int = 16000,
    audio_channels: int = 2,
    gop: int | None = None,
    frame_steps_ms: Sequence[int] | None = None,
    texture_seed: int | None = None,
) -> bytes:
    """Encode a synthetic video (optionally with the synthetic audio) and return the file bytes.

    ``container`` is an FFmpeg muxer name (``mp4``, ``matroska``, ``webm``, ``avi``, ``mov``).
    ``gop``: keyframe interval in frames (default: the codec's). ``frame_steps_ms``: variable
    frame rate; frame ``i`` lasts ``frame_steps_ms[i % len]`` ms (needs a millisecond time base,
    e.g. matroska). ``texture_seed``: add a moving random texture to the lower half.
    """
    av = import_av()
    num_frames = round(fps * seconds)
    buffer = io.BytesIO()
    output = av.open(buffer, mode="w", format=container)
    video = output.add_stream(video_codec, rate=fps)
    video.width, video.height, video.pix_fmt = width, height, "yuv420p"
    if gop is not None:
        video.codec_context.gop_size = gop
        if video_codec == "libx264":
            video.codec_context.options = {"keyint": str(gop), "min-keyint": str(gop)}
    if frame_steps_ms is not None:
        video.time_base = video.codec_context.time_base = Fraction(1, 1000)
    audio = None
    if audio_codec is not None:
        audio = output.add_stream(audio_codec, rate=audio_rate, layout=_layout(audio_channels))
    texture = None
    if texture_seed is not None:
        generator = np.random.default_rng(texture_seed)
        texture = generator.integers(0, 256, (height - height // 2, width, 3), dtype=np.uint8)
    bits = _bits_for(num_frames)
    pts = 0
    for number in range(num_frames):
        frame = av.VideoFrame.from_ndarray(
            _frame_image(number, width, height, bits, texture), format="rgb24"
        )
        if frame_steps_ms is not None:
            frame.pts = pts
            pts += frame_steps_ms[number % len(frame_steps_ms)]
        else:
            frame.pts = number
        for packet in video.encode(frame):
            output.mux(packet)
    for packet in video.encode():
        output.mux(packet)
    if audio is not None:
        _write_audio(output, audio, audio_rate, audio_channels, seconds)
    output.close()
    return buffer.getvalue()


def encode_audio(
    *,
    container: str = "wav",
    codec: str = "pcm_s16le",
    rate: int = 16000,
    channels: int = 1,
    seconds: float = 1.0,
) -> bytes:
    """Encode the synthetic audio ramp (``container``: ``wav``, ``flac``, ``mp3``, ``ogg``, ...)."""
    av = import_av()
    buffer = io.BytesIO()
    output = av.open(buffer, mode="w", format=container)
    stream = output.add_stream(codec, rate=rate, layout=_layout(channels))
    _write_audio(output, stream, rate, channels, seconds)
    output.close()
    return buffer.getvalue()


def write_tar_shards(
    root: str | os.PathLike, samples: Sequence[tuple[str, dict[str, bytes]]], num_shards: int = 1
) -> list[str]:
    """Write ``(key, {part: bytes})`` samples into ``num_shards`` tar files under ``root``
    (contiguous runs of samples per shard); returns the shard file names."""
    os.makedirs(root, exist_ok=True)
    per_shard = max(1, math.ceil(len(samples) / num_shards))
    names = []
    for shard in range(num_shards):
        chunk = samples[shard * per_shard : (shard + 1) * per_shard]
        if not chunk:
            break
        name = f"media-{shard:04d}.tar"
        with tarfile.open(os.path.join(root, name), "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, parts in chunk:
                for part, payload in parts.items():
                    info = tarfile.TarInfo(f"{key}.{part}")
                    info.size = len(payload)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(payload))
        names.append(name)
    return names
