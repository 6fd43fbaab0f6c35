"""Content sniffing for ``guess_content=True``: name the format from the first bytes, for
datasets whose part names carry no meaningful extension."""

from __future__ import annotations

__all__ = ["guess_extension"]

# (offset, magic bytes, extension), checked in order; first match wins.
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "jpg"),
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (0, b"BM", "bmp"),
    (0, b"II*\x00", "tif"),
    (0, b"MM\x00*", "tif"),
    (0, b"\x00\x00\x01\x00", "ico"),
    (0, b"\x00\x00\x00\x0cjP  ", "jp2"),
    (0, b"\x1a\x45\xdf\xa3", "mkv"),
    (0, b"fLaC", "flac"),
    (0, b"ID3", "mp3"),
    (0, b"\xff\xfb", "mp3"),
    (0, b"\xff\xf3", "mp3"),
    (0, b"\xff\xf2", "mp3"),
    (0, b"FLV\x01", "flv"),
    (0, b"OggS", "ogg"),
    (0, b"\xff\xf1", "aac"),  # ADTS, MPEG-4
    (0, b"\xff\xf9", "aac"),  # ADTS, MPEG-2
    (0, b"\x93NUMPY", "npy"),
    (4, b"ftypqt", "mov"),
    (4, b"ftyp", "mp4"),
)

# RIFF containers carry their real type at offset 8.
_RIFF_TYPES = {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}


def guess_extension(data: bytes | memoryview) -> str | None:
    """The extension matching the magic bytes of ``data``, or None if not recognised."""
    head = bytes(data[:16])
    if head.startswith(b"RIFF") and len(head) >= 12:
        return _RIFF_TYPES.get(head[8:12])
    for offset, magic, extension in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return extension
    return None
