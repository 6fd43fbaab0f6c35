"""Interleaved uint8 pixels (H, W, C) -> planar (C, H, W) uint8 or float32 in [0, 1], in one pass.

A fast decoder (:mod:`energon.decode.jpeg`) yields interleaved pixels, while ``torch*`` image modes
are planar. Converting with a transposed numpy view reads the source with a stride of C bytes per
channel and costs about as much as the decode; a small C loop (built on first use by
:mod:`energon.native`) reads every pixel once and writes all planes at the same time. A float
value is the float32 division ``v / 255``, so it is bit for bit what the numpy fallback
(``np.divide(plane, 255)``) and Pillow's path give; written as that division (not a table lookup)
the loop vectorizes.
"""

from __future__ import annotations

import ctypes

import numpy as np

from energon import native

__all__ = ["to_planar", "to_padded_planar"]

_UINT8_MAX = np.float32(255)

_SOURCE = r"""
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* Where the compiler can, the loops below are also built for AVX2 and AVX-512 and the best one
   the CPU has is picked when the library loads: converting 8 or 16 pixels per instruction
   instead of 4 is most of what makes a float slot as cheap to write as a memset of it.
   (Picking needs the C library's ifunc support; where it is missing, see _native.) */
#if defined(__x86_64__) && defined(__has_attribute) && !defined(ENERGON_NO_CLONES)
#if __has_attribute(target_clones)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef VECTOR_CLONES
#define VECTOR_CLONES
#endif

/* Float values are v / 255 in float32: one correctly rounded IEEE division, the same bits as
   numpy's float32 divide (the fallback) and as Pillow's path. */
#define AS_FLOAT(v) ((float)(v) / 255.0f)
#define AS_BYTE(v) (v)

/* Zeroes n bytes. A large run (the rows under an image in its slot) is written with streaming
   stores, which skip reading each line of a batch that no cache holds before overwriting it. */
static void zero_bytes(void *dst, size_t n) {
#if defined(__x86_64__)
    if (n >= 4096) {
        uint8_t *d = (uint8_t *)dst;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memset(d, 0, head);
        d += head;
        n -= head;
        __m128i zero = _mm_setzero_si128();
        for (; n >= 16; n -= 16, d += 16) _mm_stream_si128((__m128i *)d, zero);
        memset(d, 0, n);
        _mm_sfence(); /* streaming stores are weakly ordered: finish them before returning */
        return;
    }
#endif
    memset(dst, 0, n);
}

#define PLANAR(NAME, TYPE, CONVERT)                                                                \
    VECTOR_CLONES void NAME(const uint8_t *restrict src, int64_t pixels, int64_t channels,       \
                            TYPE *restrict dst) {                                                  \
        for (int64_t c = 0; c < channels; c++) {                                                   \
            TYPE *restrict plane = dst + c * pixels;                                               \
            const uint8_t *restrict s = src + c;                                                   \
            for (int64_t i = 0; i < pixels; i++) plane[i] = CONVERT(s[i * channels]);              \
        }                                                                                          \
    }

/* One padded batch slot (channels, slot_h, slot_w) of TYPE from (h, w, channels) pixels: the
   image in the top-left corner as CONVERT(v), zeros elsewhere; every value written once, pixels
   read once, all planes of a row at the same time. */
#define PADDED_SLOT(NAME, TYPE, CONVERT)                                                           \
    VECTOR_CLONES void NAME(const uint8_t *restrict src, int64_t h, int64_t w, int64_t channels,  \
                            TYPE *restrict dst, int64_t slot_h, int64_t slot_w) {                  \
        int64_t plane = slot_h * slot_w;                                                           \
        for (int64_t y = 0; y < h; y++) {                                                          \
            const uint8_t *restrict s = src + y * w * channels;                                    \
            TYPE *restrict r0 = dst + y * slot_w;                                                  \
            if (channels == 3) {                                                                   \
                TYPE *restrict r1 = r0 + plane;                                                    \
                TYPE *restrict r2 = r0 + 2 * plane;                                                \
                for (int64_t x = 0; x < w; x++) {                                                  \
                    r0[x] = CONVERT(s[3 * x]);                                                     \
                    r1[x] = CONVERT(s[3 * x + 1]);                                                 \
                    r2[x] = CONVERT(s[3 * x + 2]);                                                 \
                }                                                                                  \
            } else {                                                                               \
                for (int64_t c = 0; c < channels; c++)                                             \
                    for (int64_t x = 0; x < w; x++)                                                \
                        r0[c * plane + x] = CONVERT(s[x * channels + c]);                          \
            }                                                                                      \
            if (slot_w > w)                                                                        \
                for (int64_t c = 0; c < channels; c++)                                             \
                    memset(r0 + c * plane + w, 0, (size_t)(slot_w - w) * sizeof(TYPE));           \
        }                                                                                          \
        size_t below = (size_t)((slot_h - h) * slot_w) * sizeof(TYPE);                             \
        for (int64_t c = 0; below && c < channels; c++)                                            \
            zero_bytes(dst + c * plane + h * slot_w, below);                                       \
    }

PLANAR(planar_f32, float, AS_FLOAT)
PLANAR(planar_u8, uint8_t, AS_BYTE)
PADDED_SLOT(planar_f32_slot, float, AS_FLOAT)
PADDED_SLOT(planar_u8_slot, uint8_t, AS_BYTE)
"""
# -O3: GCC vectorizes the strided (de-interleaving) loads of these loops only at -O3.
_FLAGS = ("-O3", *(flag for flag in native.FLAGS if flag != "-O2"))

_library: ctypes.CDLL | None | bool = False  # False: not loaded yet


def _native() -> ctypes.CDLL | None:
    global _library
    if _library is False:
        library = _build()
        if library is None and not native.disabled():  # a C library without ifunc (musl)
            library = _build(vector_clones=False)
        _library = library
    return _library  # type: ignore[return-value]


def _build(vector_clones: bool = True) -> ctypes.CDLL | None:
    """The compiled loops with their signatures declared, or None without a compiler."""
    flags = _FLAGS if vector_clones else (*_FLAGS, "-DENERGON_NO_CLONES")
    library = native.load_library("planar", _SOURCE, flags)
    if library is not None:
        pointer, count = ctypes.c_void_p, ctypes.c_int64
        for loop in (library.planar_f32, library.planar_u8):
            loop.argtypes = [pointer, count, count, pointer]
            loop.restype = None
        for slot in (library.planar_f32_slot, library.planar_u8_slot):
            slot.argtypes = [pointer, count, count, count, pointer, count, count]
            slot.restype = None
    return library


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
        convert = library.planar_f32 if out.dtype == np.float32 else library.planar_u8
        convert(pixels.ctypes.data, height * width, channels, out.ctypes.data)
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
