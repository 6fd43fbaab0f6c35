"""Fast path for PCM WAV held in memory: parse the RIFF header and slice samples with numpy.

WAV audio is uncompressed, so going through a codec only copies bytes frame by frame. Reading the
``fmt `` and ``data`` chunks directly turns a clip request into one array slice. The values and
dtypes match what FFmpeg's PCM decoders produce, so both paths are interchangeable: 8-bit ->
uint8, 16-bit -> int16, 24-bit -> int32 (value shifted into the high bytes, as FFmpeg does),
32-bit -> int32, float -> float32/float64. Anything else (compressed WAV, big-endian RIFX, ...)
returns None and the caller uses PyAV.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["PcmWav", "parse_pcm_wav"]

_FORMAT_PCM = 1
_FORMAT_FLOAT = 3
_FORMAT_EXTENSIBLE = 0xFFFE


@dataclass(frozen=True)
class PcmWav:
    """Header facts plus where the sample bytes live inside the file."""

    channels: int
    sample_rate: int
    bits_per_sample: int
    is_float: bool
    data_offset: int
    data_size: int  # bytes, rounded down to whole sample frames

    @property
    def block_align(self) -> int:
        return self.channels * (self.bits_per_sample // 8)

    @property
    def num_samples(self) -> int:
        return self.data_size // self.block_align

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate

    def clip(self, data: bytes, first: int, count: int | None) -> tuple[np.ndarray, int] | None:
        """Samples ``[first, first + count)`` (``count=None``: to the end) and the index of the
        first one, as the audio cursor gives them; None if ``first`` lies beyond the end."""
        first = max(0, first)
        if first >= self.num_samples:
            return None
        count = self.num_samples - first if count is None else count
        return self.read(data, first, count), first

    def read(self, data: bytes, first: int, count: int) -> np.ndarray:
        """Samples ``[first, first + count)`` as a (channels, count) array (a copy)."""
        first = max(0, min(first, self.num_samples))
        count = max(0, min(count, self.num_samples - first))
        start = self.data_offset + first * self.block_align
        raw = memoryview(data)[start : start + count * self.block_align]
        return _to_array(raw, self).reshape(count, self.channels).T.copy()


def _to_array(raw: memoryview, wav: PcmWav) -> np.ndarray:
    width = wav.bits_per_sample // 8
    if wav.is_float:
        return np.frombuffer(raw, dtype="<f4" if width == 4 else "<f8")
    if width == 1:
        return np.frombuffer(raw, dtype=np.uint8)
    if width == 2:
        return np.frombuffer(raw, dtype="<i2")
    if width == 4:
        return np.frombuffer(raw, dtype="<i4")
    # 24-bit: place the three little-endian bytes in the top of an int32, like FFmpeg's s32 output
    triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.uint32)
    packed = (triples[:, 0] << 8) | (triples[:, 1] << 16) | (triples[:, 2] << 24)
    return packed.view(np.int32)


def _iter_chunks(data: bytes):
    """(chunk id, payload offset, payload size) of the RIFF chunks after the ``WAVE`` tag."""
    offset = 12
    while offset + 8 <= len(data):
        chunk_id = data[offset : offset + 4]
        (size,) = struct.unpack_from("<I", data, offset + 4)
        yield chunk_id, offset + 8, size
        offset += 8 + size + (size & 1)  # chunks are padded to even sizes


def _sample_format(data: bytes, offset: int, size: int) -> tuple[int, int, int, bool] | None:
    """(channels, rate, bits, is_float) of a ``fmt `` chunk, or None if it is not plain PCM/float."""
    if size < 16:
        return None
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, offset)
    if tag == _FORMAT_EXTENSIBLE and size >= 40:
        (tag,) = struct.unpack_from("<H", data, offset + 24)  # first bytes of the sub-format GUID
    if channels == 0 or rate == 0:
        return None
    if tag == _FORMAT_PCM and bits in (8, 16, 24, 32):
        return channels, rate, bits, False
    if tag == _FORMAT_FLOAT and bits in (32, 64):
        return channels, rate, bits, True
    return None


def parse_pcm_wav(data: bytes) -> PcmWav | None:
    """Header of a little-endian PCM/float WAV, or None if ``data`` is anything else."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    fmt = None
    for chunk_id, offset, size in _iter_chunks(data):
        if chunk_id == b"fmt ":
            fmt = _sample_format(data, offset, size)
            if fmt is None:
                return None
        elif chunk_id == b"data" and fmt is not None:
            channels, rate, bits, is_float = fmt
            available = min(size, len(data) - offset)  # tolerate a wrong size (streamed writers)
            block = channels * (bits // 8)
            return PcmWav(channels, rate, bits, is_float, offset, available - available % block)
    return None
