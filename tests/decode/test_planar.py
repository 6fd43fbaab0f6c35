"""The C loops that write decoded pixels as planes (and into padded batch slots) give exactly what
the numpy fallback gives: float32 ``v / 255`` bit for bit, and zeros everywhere around the image."""

from __future__ import annotations

import numpy as np
import pytest

import energon.decode.planar as planar

needs_native = pytest.mark.skipif(planar._native() is None, reason="no C compiler on this machine")


def _expected_slot(pixels: np.ndarray, shape: tuple[int, int, int], dtype) -> np.ndarray:
    height, width = pixels.shape[:2]
    expected = np.zeros(shape, dtype=dtype)
    planes = pixels.transpose(2, 0, 1)
    if dtype == np.float32:
        planes = np.divide(planes, np.float32(255), dtype=np.float32)
    expected[:, :height, :width] = planes
    return expected


def _every_byte_value(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Random pixels in which every channel takes each of the 256 values (as many as fit) once."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    count = min(256, height * width)
    for channel in range(channels):
        pixels.reshape(-1, channels)[:count, channel] = rng.permutation(256)[:count]
    return pixels


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_planar_kernel_equals_numpy(channels, dtype, monkeypatch):
    pixels = _every_byte_value(37, 53, channels, seed=channels)
    out_native = planar.to_planar(pixels, np.empty((channels, 37, 53), dtype))
    monkeypatch.setattr(planar, "_library", None)  # the numpy fallback
    out_numpy = planar.to_planar(pixels, np.empty((channels, 37, 53), dtype))
    assert np.array_equal(out_native, out_numpy)
    expected = pixels.transpose(2, 0, 1)
    if dtype == np.float32:
        expected = np.divide(expected, np.float32(255), dtype=np.float32)
    assert np.array_equal(out_numpy, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_padded_slot_kernel_equals_numpy(dtype, monkeypatch):
    pixels = _every_byte_value(21, 34, 3, seed=9)
    native_slot = np.full((3, 30, 40), 7, dtype=dtype)  # stale values must be overwritten
    planar.to_padded_planar(pixels, native_slot)
    monkeypatch.setattr(planar, "_library", None)  # the numpy fallback
    numpy_slot = np.full((3, 30, 40), 7, dtype=dtype)
    planar.to_padded_planar(pixels, numpy_slot)
    expected = _expected_slot(pixels, (3, 30, 40), dtype)
    assert np.array_equal(native_slot, expected) and np.array_equal(numpy_slot, expected)


@needs_native
def test_float_values_are_the_float32_division_bit_for_bit():
    values = np.arange(256, dtype=np.uint8).reshape(16, 16, 1)
    out = planar.to_planar(values, np.empty((1, 16, 16), np.float32))
    expected = np.divide(values[:, :, 0], np.float32(255), dtype=np.float32)
    assert out.tobytes() == expected.tobytes()
    assert out[0, 0, 0] == 0.0 and out[0, 15, 15] == 1.0


@needs_native
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_large_padding_is_zeroed_at_any_alignment(channels, dtype, offset):
    """The rows under the image are many kilobytes here, so they take the streaming-store path;
    the slot starts ``offset`` values into its buffer so that path starts unaligned too."""
    shape = (channels, 97, 131)
    pixels = _every_byte_value(23, 17, channels, seed=offset)
    size = int(np.prod(shape))
    buffer = np.full(size + offset + 5, 7, dtype=dtype)  # stale values, and a guard after the slot
    slot = buffer[offset : offset + size].reshape(shape)
    planar.to_padded_planar(pixels, slot)
    assert np.array_equal(slot, _expected_slot(pixels, shape, dtype))
    assert (buffer[:offset] == 7).all() and (buffer[offset + size :] == 7).all()


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_image_filling_its_slot_and_one_row_or_column_images(dtype):
    for height, width, shape in [(40, 50, (3, 40, 50)), (1, 50, (3, 40, 50)), (40, 1, (3, 40, 50))]:
        pixels = _every_byte_value(height, width, 3, seed=height)
        slot = np.full(shape, 7, dtype=dtype)
        planar.to_padded_planar(pixels, slot)
        assert np.array_equal(slot, _expected_slot(pixels, shape, dtype))


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_build_without_vector_clones_writes_the_same(dtype, monkeypatch):
    """The fallback build for C libraries without ifunc gives the same values as the default."""
    monkeypatch.setattr(planar, "_library", planar._build(vector_clones=False))
    pixels = _every_byte_value(29, 31, 3, seed=5)
    slot = np.full((3, 97, 131), 7, dtype=dtype)
    planar.to_padded_planar(pixels, slot)
    assert np.array_equal(slot, _expected_slot(pixels, slot.shape, dtype))
    out = planar.to_planar(pixels, np.empty((3, 29, 31), dtype))
    assert np.array_equal(out, _expected_slot(pixels, (3, 29, 31), dtype))
