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

__all__ = ["to_planar", "to_padded_planar"]

_UINT8_MAX = np.float32(255)
_FLOAT_TABLE = np.divide(np.arange(256, dtype=np.uint8), _UINT8_MAX, dtype=np.float32)

_SOURCE = r"""
#include <stdint.h>
#include <stddef.h>
#include <string.h>

void planar_f32(const uint8_t *src, int64_t pixels, int64_t channels, const float *table,
                float *dst) {
    for (int64_t c = 0; c < channels; c++) {
        float *plane = dst + c * pixels;
        const uint8_t *s = src + c;
        for (int64_t i = 0; i < pixels; i++) plane[i] = table[s[i * channels]];
    }
}

/* One padded batch slot (channels, slot_h, slot_w) of TYPE from (h, w, channels) pixels: the
   image in the top-left corner as CONVERT(v), zeros elsewhere; every value written once, pixels
   read once. Defined for float slots (table[v], the table of v / 255) and uint8 slots (v). */
#define AS_FLOAT(v) table[v]
#define AS_BYTE(v) ((void)table, (v))
#define PADDED_SLOT(NAME, TYPE, CONVERT)                                                          \
    void NAME(const uint8_t *src, int64_t h, int64_t w, int64_t channels, const float *table,   \
              TYPE *dst, int64_t slot_h, int64_t slot_w) {                                      \
        int64_t plane = slot_h * slot_w;                                                        \
        for (int64_t y = 0; y < h; y++) {                                                       \
            const uint8_t *s = src + y * w * channels;                                          \
            TYPE *row = dst + y * slot_w;                                                       \
            if (channels == 3) {                                                                \
                TYPE *r0 = row, *r1 = row + plane, *r2 = row + 2 * plane;                       \
                for (int64_t x = 0; x < w; x++) {                                               \
                    r0[x] = CONVERT(s[3 * x]);                                                  \
                    r1[x] = CONVERT(s[3 * x + 1]);                                              \
                    r2[x] = CONVERT(s[3 * x + 2]);                                              \
                }                                                                               \
            } else {                                                                            \
                for (int64_t c = 0; c < channels; c++)                                          \
                    for (int64_t x = 0; x < w; x++)                                             \
                        row[c * plane + x] = CONVERT(s[x * channels + c]);                      \
            }                                                                                   \
            if (slot_w > w)                                                                     \
                for (int64_t c = 0; c < channels; c++)                                          \
                    memset(row + c * plane + w, 0, (size_t)(slot_w - w) * sizeof(TYPE));        \
        }                                                                                       \
        if (slot_h > h)                                                                         \
            for (int64_t c = 0; c < channels; c++)                                              \
                memset(dst + c * plane + h * slot_w, 0,                                         \
                       (size_t)((slot_h - h) * slot_w) * sizeof(TYPE));                         \
    }

PADDED_SLOT(planar_f32_slot, float, AS_FLOAT)
PADDED_SLOT(planar_u8_slot, uint8_t, AS_BYTE)

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
            library.planar_f32_slot.argtypes = [pointer, count, count, count, pointer, pointer]
            library.planar_f32_slot.argtypes += [count, count]
            library.planar_f32_slot.restype = None
            library.planar_u8_slot.argtypes = library.planar_f32_slot.argtypes
            library.planar_u8_slot.restype = None
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


def to_padded_planar(pixels: np.ndarray, slot: np.ndarray) -> None:
    """Write (H, W, C) uint8 ``pixels`` into the top-left corner of the (C, slot_h, slot_w)
    ``slot`` and zero the rest of it (a padded batch slot): as float32 ``v / 255`` into a float32
    slot, as they are into a uint8 slot."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    height, width, channels = pixels.shape
    slot_channels, slot_height, slot_width = slot.shape
    if slot.dtype not in (np.float32, np.uint8) or slot_channels != channels:
        raise ValueError(
            f"cannot write {pixels.shape} pixels into a {slot.shape} {slot.dtype} slot"
        )
    if slot_height < height or slot_width < width:
        raise ValueError(f"a {slot.shape} slot is too small for {pixels.shape} pixels")
    library = _native()
    if library is not None and pixels.flags.c_contiguous and slot.flags.c_contiguous:
        write_slot = library.planar_u8_slot if slot.dtype == np.uint8 else library.planar_f32_slot
        write_slot(
            pixels.ctypes.data,
            height,
            width,
            channels,
            _FLOAT_TABLE.ctypes.data,
            slot.ctypes.data,
            slot_height,
            slot_width,
        )
        return
    for channel in range(channels):
        if slot.dtype == np.uint8:
            slot[channel, :height, :width] = pixels[:, :, channel]
        else:
            np.divide(pixels[:, :, channel], _UINT8_MAX, out=slot[channel, :height, :width])
    slot[:, :height, width:] = 0
    slot[:, height:, :] = 0
