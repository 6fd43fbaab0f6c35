"""The fast JPEG path (simplejpeg) gives Pillow's pixels, and falls back to Pillow where it would not."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from energon.decode import IMAGE_MODES, decode_image
from energon.decode.image import open_image
from energon.decode.jpeg import decode_jpeg, fast_jpeg_available

pytest.importorskip("simplejpeg")


def _photo_like(width: int, height: int, seed: int) -> np.ndarray:
    """Smooth gradients plus noise and a few hard edges: exercises DCT, upsampling and clipping."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(1, width - 1), y * 255 / max(1, height - 1), (x + y) % 256], -1)
    base[height // 3 : height // 2, :, 0] = 255
    noise = rng.normal(0, 25, size=base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, mode: str = "RGB", **save_options) -> bytes:
    image = Image.fromarray(pixels, "RGB").convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **save_options)
    return buffer.getvalue()


CASES = [
    # (width, height, save options)
    (1, 1, {"quality": 90}),
    (17, 33, {"quality": 75, "subsampling": 2}),  # odd sizes, 4:2:0
    (256, 320, {"quality": 95, "subsampling": 0}),  # 4:4:4
    (320, 256, {"quality": 85, "subsampling": 1}),  # 4:2:2
    (641, 479, {"quality": 80, "progressive": True}),
    (500, 375, {"quality": 60, "optimize": True}),
]


@pytest.mark.parametrize("width,height,options", CASES)
@pytest.mark.parametrize("source_mode", ["RGB", "L"])
def test_rgb_pixels_equal_pillows(width, height, options, source_mode):
    data = _jpeg(_photo_like(width, height, seed=width), source_mode, **options)
    fast = decode_jpeg(data, "RGB")
    assert fast is not None, "a YCbCr or grayscale JPEG takes the fast path"
    reference = np.asarray(open_image(data, "RGB"))
    assert fast.shape == reference.shape == (height, width, 3)
    assert np.abs(fast.astype(np.int16) - reference).max() <= 1


@pytest.mark.parametrize("mode", ["torchrgb", "torchrgb8", "rgb8", "rgb", "torchl", "l8"])
def test_decoded_values_equal_the_pillow_path_in_every_mode(mode, monkeypatch):
    for source_mode in ("RGB", "L"):
        data = _jpeg(_photo_like(123, 77, seed=3), source_mode, quality=88)
        fast = decode_image(data, IMAGE_MODES[mode])
        monkeypatch.setenv("ENERGON_NO_FAST_JPEG", "1")
        slow = decode_image(data, IMAGE_MODES[mode])
        monkeypatch.delenv("ENERGON_NO_FAST_JPEG")
        assert type(fast) is type(slow) and fast.shape == slow.shape and fast.dtype == slow.dtype
        fast_array = fast.numpy() if isinstance(fast, torch.Tensor) else fast
        slow_array = slow.numpy() if isinstance(slow, torch.Tensor) else slow
        if fast_array.dtype == np.uint8:
            assert np.abs(fast_array.astype(np.int16) - slow_array).max() <= 1
        else:
            assert np.abs(fast_array - slow_array).max() <= 1 / 255 + 1e-7


def test_gray_output_only_from_gray_jpegs():
    """Pillow's RGB -> L weights are not libjpeg's luma: colour JPEGs decoded to L go to Pillow."""
    pixels = _photo_like(64, 48, seed=5)
    assert decode_jpeg(_jpeg(pixels, "RGB"), "L") is None
    gray = decode_jpeg(_jpeg(pixels, "L"), "L")
    assert gray is not None and gray.shape == (48, 64, 1)


def test_cmyk_and_non_jpeg_fall_back_to_pillow():
    pixels = _photo_like(40, 30, seed=7)
    cmyk = _jpeg(pixels, "CMYK", quality=90)
    assert decode_jpeg(cmyk, "RGB") is None
    value = decode_image(cmyk, IMAGE_MODES["torchrgb8"])
    assert torch.equal(value, torch.from_numpy(np.array(open_image(cmyk, "RGB"))).permute(2, 0, 1))
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    assert decode_jpeg(png.getvalue(), "RGB") is None


def test_damaged_jpeg_keeps_pillows_error():
    data = _jpeg(_photo_like(200, 200, seed=9), quality=90)
    truncated = data[: len(data) // 2]
    assert decode_jpeg(truncated, "RGB") is None
    with pytest.raises(OSError):
        decode_image(truncated, IMAGE_MODES["torchrgb"])


def test_switch_off_with_environment(monkeypatch):
    assert fast_jpeg_available()
    monkeypatch.setenv("ENERGON_NO_FAST_JPEG", "1")
    assert not fast_jpeg_available()
    assert decode_jpeg(_jpeg(_photo_like(8, 8, seed=1)), "RGB") is None
