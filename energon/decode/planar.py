"""Interleaved uint8 pixels (H, W, C) -> planar (C, H, W) uint8 or float32 in [0, 1], in one pass.

A fast decoder (:mod:`energon.decode.jpeg`) yields interleaved pixels, while ``torch*`` image modes
are planar. Converting with a transposed numpy view reads the source with a stride of C bytes per
channel and costs about as much as the decode; a small C loop (built on first use by
:mod:`energon.native`) reads every pixel once and writes all planes at the same time. The float
values come from a 256-entry table computed by numpy as ``float32(v) / float32(255)``, so they are
bit for bit what the numpy fallback (``np.divide(plane, 255)``) and Pillow's path give.
"""

from __future__ import annotations

import ctypes

import numpy as np

from energon import native

__all__ = ["to_planar"]

_UINT8_MAX = np.float32(255)
_FLOAT_TABLE = np.divide(np.arange(256, dtype=np.uint8), _UINT8_MAX, dtype=np.float32)

_SOURCE = r"""
#include <stdint.h>
#include <stddef.h>

void planar_f32(const uint8_t *src, int64_t pixels, int64_t channels, const float *table,
                float *dst) {
    for (int64_t c = 0; c < channels; c++) {
        float *plane = dst + c * pixels;
        const uint8_t *s = src + c;
        for (int64_t i = 0; i < pixels; i++) plane[i] = table[s[i * channels]];
    }
}

void planar_u8(const uint8_t *src, int64_t pixels, int64_t channels, uint8_t *dst) {
    for (int64_t c = 0; c < channels; c++) {
        uint8_t *plane = dst + c * pixels;
        const uint8_t *s = src + c;
        for (int64_t i = 0; i < pixels; i++) plane[i] = s[i * channels];
    }
}
"""

_library: ctypes.CDLL | None | bool = False  # False: not loaded yet


def _native() -> ctypes.CDLL | None:
    global _library
    if _library is False:
        library = native.load_library("planar", _SOURCE)
        if library is not None:
            pointer, count = ctypes.c_void_p, ctypes.c_int64
            library.planar_f32.argtypes = [pointer, count, count, pointer, pointer]
            library.planar_f32.restype = None
            library.planar_u8.argtypes = [pointer, count, count, pointer]
            library.planar_u8.restype = None
        _library = library
    return _library  # type: ignore[return-value]


def to_planar(pixels: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write ``pixels`` (H, W, C) or (H, W) uint8 into ``out`` (C, H, W), uint8 or float32.

    Float values are ``v / 255``. Returns ``out``.
    """
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    height, width, channels = pixels.shape
    if out.shape != (channels, height, width) or out.dtype not in (np.float32, np.uint8):
        raise ValueError(f"cannot write {pixels.shape} uint8 pixels into {out.shape} {out.dtype}")
    library = _native()
    if library is not None and pixels.flags.c_contiguous and out.flags.c_contiguous:
        if out.dtype == np.float32:
            library.planar_f32(
                pixels.ctypes.data,
                height * width,
                channels,
                _FLOAT_TABLE.ctypes.data,
                out.ctypes.data,
            )
        else:
            library.planar_u8(pixels.ctypes.data, height * width, channels, out.ctypes.data)
        return out
    for channel in range(channels):
        if out.dtype == np.float32:
            np.divide(pixels[:, :, channel], _UINT8_MAX, out=out[channel])
        else:
            out[channel] = pixels[:, :, channel]
    return out
