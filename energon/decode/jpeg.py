"""Fast JPEG -> RGB / gray decoding with simplejpeg (libjpeg-turbo), when it is installed.

Pillow decodes JPEGs with libjpeg-turbo too, but goes through its own image object, a mode
conversion and a copy per band. ``simplejpeg`` (a default dependency where PyPI has its wheels)
decodes straight into a numpy buffer with the same library and the same settings (accurate integer
DCT, fancy upsampling), so the pixels equal Pillow's (tests/decode/test_jpeg.py checks real JPEGs of
several sizes, chroma subsamplings, progressive and grayscale ones).

Only the cases whose result is Pillow's are taken here; everything else returns None and the caller
decodes with Pillow as before:

* colour spaces: YCbCr and grayscale JPEGs. CMYK / YCCK (Adobe) JPEGs go to Pillow, which inverts
  Adobe CMYK and converts CMYK -> RGB with its own formula,
* gray output (``l8``, ``torchl``...) only from grayscale JPEGs: Pillow's RGB -> L weights differ
  from libjpeg's luma channel,
* anything simplejpeg refuses (corrupt or truncated data, 12-bit or arithmetic-coded JPEGs) and
  images above Pillow's ``MAX_IMAGE_PIXELS`` go to Pillow, so errors and the decompression-bomb
  check stay Pillow's.

``ENERGON_NO_FAST_JPEG=1`` switches this path off (Pillow only).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from PIL import Image

try:  # not installed where PyPI has no wheel of it (pyproject.toml)
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

__all__ = ["decode_jpeg", "fast_jpeg_available", "is_jpeg"]

_JPEG_SOI = b"\xff\xd8\xff"
_DIRECT_COLORSPACES = {"YCbCr": "RGB", "Gray": "GRAY"}  # file colour space -> what decodes exactly


def fast_jpeg_available() -> bool:
    """Whether JPEGs are decoded with simplejpeg (installed and not switched off)."""
    return simplejpeg is not None and not os.environ.get("ENERGON_NO_FAST_JPEG")


def is_jpeg(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts like a JPEG (its SOI marker)."""
    return bytes(data[:3]) == _JPEG_SOI


def _header(data: bytes | memoryview) -> tuple[int, int, str] | None:
    """(height, width, colour space) of a JPEG simplejpeg can read, else None."""
    if not is_jpeg(data):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    return height, width, colorspace


def decode_jpeg(
    data: bytes | memoryview,
    pil_mode: str,
    allocate: Callable[[tuple[int, ...]], np.ndarray] | None = None,
) -> np.ndarray | None:
    """(H, W, 3) for ``RGB`` or (H, W, 1) for ``L`` uint8 pixels equal to Pillow's, or None (then
    decode with Pillow).

    ``allocate(shape)`` gives the uint8 array to decode into (e.g. a pooled one), and that very
    array is returned (a pooled array must not be replaced by a view: numpy views do not keep it
    alive); by default a new array.
    """
    if pil_mode not in ("RGB", "L") or not fast_jpeg_available():
        return None
    header = _header(data)
    if header is None:
        return None
    height, width, colorspace = header
    if colorspace not in _DIRECT_COLORSPACES:
        return None
    if pil_mode == "L" and colorspace != "Gray":
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > limit:
        return None  # Pillow warns or refuses: let it
    channels = 3 if pil_mode == "RGB" else 1
    buffer = allocate((height, width, channels)) if allocate is not None else None
    try:
        pixels = simplejpeg.decode_jpeg(
            data,
            colorspace="RGB" if pil_mode == "RGB" else "GRAY",
            fastdct=False,
            fastupsample=False,
            strict=True,
            buffer=buffer,
        )
    except ValueError:
        return None  # damaged or unusual: Pillow decides (and words the error as before)
    if buffer is None:
        return pixels.reshape(height, width, channels)
    if pixels.shape != buffer.shape:
        raise AssertionError(f"simplejpeg decoded {pixels.shape}, header said {buffer.shape}")
    return buffer
