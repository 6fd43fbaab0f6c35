"""Image decoding with Pillow into the webdataset-style ``image_decode`` modes.

The default mode ``torchrgb`` is on the hot path of every image dataset, so the conversion to a
float32 (C, H, W) tensor is done in one pass per channel: Pillow packs each band into its own
byte string (a fast C loop) and numpy divides that plane by 255 straight into its slot of the
preallocated output. That yields a contiguous CHW tensor, like the reference, and is faster than
the interleaved HWC conversion followed by a permute (see ``docs/samples.md`` for measurements). Images are always decoded
at full size (no ``draft``/``reduce``).

JPEGs that simplejpeg decodes exactly as Pillow does (installed by default where it has wheels, see
:mod:`energon.decode.jpeg`) skip Pillow: the interleaved pixels go to their planes in one pass
(:mod:`energon.decode.planar`) straight into the pooled output.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from energon.decode.jpeg import decode_jpeg, fast_jpeg_available, is_jpeg
from energon.decode.pending import PendingImage
from energon.decode.planar import to_planar
from energon.decode.threads import DecodeWindow, current_window
from energon.memory.buffer_pool import pooled_empty

__all__ = ["IMAGE_EXTENSIONS", "IMAGE_MODES", "ImageMode", "decode_image"]

#: Extensions (lower case, last dot component) decoded as images, as in webdataset.
IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    """blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf png apng
    jp2 j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg msp pcd pxr pbm pgm
    ppm pnm psd bw rgb rgba sgi ras tga icb vda vst webp wmf emf xbm xpm""".split()
)

_UINT8_MAX = np.float32(255)


@dataclass(frozen=True, slots=True)
class ImageMode:
    """What an ``image_decode`` name produces: container (numpy/torch/pil), value type
    (uint8 or float in [0, 1]) and Pillow colour mode."""

    container: str
    value_type: str | None
    pil_mode: str


#: Every supported ``image_decode`` value. L modes give 2-D (H, W) arrays, as in webdataset.
IMAGE_MODES: dict[str, ImageMode] = {
    "l8": ImageMode("numpy", "uint8", "L"),
    "rgb8": ImageMode("numpy", "uint8", "RGB"),
    "rgba8": ImageMode("numpy", "uint8", "RGBA"),
    "l": ImageMode("numpy", "float", "L"),
    "rgb": ImageMode("numpy", "float", "RGB"),
    "rgba": ImageMode("numpy", "float", "RGBA"),
    "torchl8": ImageMode("torch", "uint8", "L"),
    "torchrgb8": ImageMode("torch", "uint8", "RGB"),
    "torchrgba8": ImageMode("torch", "uint8", "RGBA"),
    "torchl": ImageMode("torch", "float", "L"),
    "torchrgb": ImageMode("torch", "float", "RGB"),
    "torch": ImageMode("torch", "float", "RGB"),
    "torchrgba": ImageMode("torch", "float", "RGBA"),
    "pill": ImageMode("pil", None, "L"),
    "pil": ImageMode("pil", None, "RGB"),
    "pilrgb": ImageMode("pil", None, "RGB"),
    "pilrgba": ImageMode("pil", None, "RGBA"),
    # left encoded (bytes), for decoding on the training device (energon.decode.device)
    "encoded": ImageMode("bytes", None, "RGB"),
}


_FLOAT_RGB = IMAGE_MODES["torchrgb"]
_UINT8_RGB = IMAGE_MODES["torchrgb8"]


def open_image(data: bytes | memoryview, pil_mode: str) -> Image.Image:
    """Fully decode ``data`` with Pillow and convert it to ``pil_mode`` (no copy if it already is)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    if image.mode != pil_mode:
        image = image.convert(pil_mode)
    return image


# Pillow "raw" packers that extract one band each, so every plane leaves Pillow already separated.
_BAND_RAWMODES: dict[str, tuple[str, ...]] = {
    "L": ("L",),
    "RGB": ("R", "G", "B"),
    "RGBA": ("R", "G", "B", "A"),
}


def _plane_bytes(image: Image.Image) -> list[bytes]:
    """The image's bands as separate row-major byte strings (one C-level pass per band)."""
    return [image.tobytes("raw", rawmode) for rawmode in _BAND_RAWMODES[image.mode]]


def _planar(image: Image.Image, dtype: type, keep_channel_dim: bool) -> np.ndarray:
    """(C, H, W) array (or (H, W) for L) that owns its memory; float values are scaled to [0, 1].

    Each band goes from Pillow straight into its slot of one preallocated array; for float the
    uint8 -> float32 conversion and the division by 255 happen in that same write, so the values
    equal the reference's ``x / 255`` bit for bit.
    """
    width, height = image.size
    planes = _plane_bytes(image)
    out = pooled_empty((len(planes), height, width), dtype)
    for channel, raw in enumerate(planes):
        plane = np.frombuffer(raw, dtype=np.uint8).reshape(height, width)
        if dtype is np.float32:
            np.divide(plane, _UINT8_MAX, out=out[channel])
        else:
            out[channel] = plane
    return out if keep_channel_dim else out[0]


def _interleaved(image: Image.Image, value_type: str) -> np.ndarray:
    """(H, W, C) or (H, W) numpy array as webdataset returns it, but always writable."""
    pixels = np.asarray(image)
    if value_type == "uint8":
        return pixels.copy()
    out = np.empty(pixels.shape, dtype=np.float32)
    np.divide(pixels, _UINT8_MAX, out=out)
    return out


class _Deferral(threading.local):
    active = False


_deferral = _Deferral()


def set_images_deferred(active: bool) -> bool:
    """While on (on this thread), RGB torch images (float or uint8) that the fast JPEG path
    decodes come back as :class:`~energon.decode.pending.PendingImage` for the batch to convert.
    Only the pipeline's load stage switches it on, where the library's own batching is all that
    sees samples. Returns the previous setting, for the caller to restore."""
    previous = _deferral.active
    _deferral.active = active
    return previous


def _pooled_pixels(shape: tuple[int, ...]) -> np.ndarray:
    return pooled_empty(shape, np.uint8)


def _decode_on_thread(window: DecodeWindow, data: bytes | memoryview, mode: ImageMode) -> Any:
    """A PendingImage whose pixels a decode thread fills in (energon.decode.threads)."""
    dtype = torch.uint8 if mode == _UINT8_RGB else torch.float32
    pending = PendingImage(None, dtype, window.threads)
    window.submit(_decode_into, pending, bytes(data))
    return pending


def _decode_into(pending: PendingImage, data: bytes) -> bool:
    """Decode on the fast path into ``pending``; False if that path does not take the image."""
    pending.pixels = decode_jpeg(data, "RGB", _pooled_pixels)
    return pending.pixels is not None


def _from_pixels(pixels: np.ndarray, mode: ImageMode) -> Any:
    """The value of ``mode`` from decoded interleaved uint8 pixels ((H, W, 3) or (H, W))."""
    if mode.container == "numpy":
        if mode.pil_mode == "L":
            pixels = pixels[:, :, 0]
        if mode.value_type == "uint8":
            return pixels
        out = np.empty(pixels.shape, dtype=np.float32)
        np.divide(pixels, _UINT8_MAX, out=out)
        return out
    dtype = np.float32 if mode.value_type == "float" else np.uint8
    height, width, channels = pixels.shape
    tensor = torch.from_numpy(to_planar(pixels, pooled_empty((channels, height, width), dtype)))
    return tensor if mode.pil_mode != "L" else tensor[0]  # a torch view keeps the pooled array


def decode_image(data: bytes | memoryview, mode: ImageMode) -> Any:
    """Decode one encoded image into the container, value type and colour mode of ``mode``."""
    if mode.container == "bytes":
        return bytes(data)  # its own copy: ``data`` may view a reused read buffer
    if mode.container != "pil":
        deferred = _deferral.active and (mode == _FLOAT_RGB or mode == _UINT8_RGB)
        if deferred:
            window = current_window()
            if window is not None and is_jpeg(data) and fast_jpeg_available():
                return _decode_on_thread(window, data, mode)
        pixels = decode_jpeg(
            data, mode.pil_mode, _pooled_pixels if mode.container == "torch" else None
        )
        if pixels is not None:
            if deferred:
                return PendingImage(pixels, torch.uint8 if mode == _UINT8_RGB else torch.float32)
            return _from_pixels(pixels, mode)
    image = open_image(data, mode.pil_mode)
    if mode.container == "pil":
        # a plain Image, as the reference's convert() gives (not the file's PngImageFile, ...)
        return image if type(image) is Image.Image else image.copy()
    if mode.container == "numpy":
        return _interleaved(image, mode.value_type or "uint8")
    dtype = np.float32 if mode.value_type == "float" else np.uint8
    # (C, H, W) first: a torch view keeps a pooled array alive, a numpy view (out[0]) would not
    tensor = torch.from_numpy(_planar(image, dtype, keep_channel_dim=True))
    return tensor if mode.pil_mode != "L" else tensor[0]
