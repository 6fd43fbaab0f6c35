"""Images decoded on the training device: workers hand over the encoded bytes, the main process
decodes each batch there (nvJPEG through ``torchvision.io.decode_jpeg`` on CUDA).

With ``image_decode="encoded"`` the loader leaves image parts as their encoded bytes, so a batch's
``image`` is a list of ``bytes``: the workers only read, and what travels to the main process is
the compressed file (a tenth of the uint8 pixels or less). :class:`DeviceImageDecoder` turns such
a list into one pad-stacked uint8 (N, 3, H, W) tensor on the device, laid out like the
``torchrgb8`` batches (each image in the top-left corner of its slot, zeros around it), and
optionally through an :class:`~energon.decode.normalize.ImageNormalizer` into float.

What goes where:

* JPEGs that nvJPEG decodes like the CPU path (YCbCr and grayscale, 8-bit) are decoded on a CUDA
  device in one batched call. nvJPEG upsamples chroma the simple way, not with libjpeg-turbo's
  default "fancy" interpolation: on subsampled (4:2:0, 4:2:2) JPEGs its pixels differ from the
  CPU path's at colour edges (measured: up to 116) and equal libjpeg-turbo's with simple
  upsampling (docs/samples.md gives the measured numbers).
* Everything else (PNG, WebP, CMYK JPEGs, ...) and any image the device refuses is decoded on the
  CPU by energon's own decoder (the ``torchrgb8`` path) and copied over; :attr:`cpu_fallbacks`
  counts those, so a dataset that silently decodes on the CPU shows up.
* On a CPU device every image takes that CPU path (the same pixels as ``torchrgb8``), which
  needs no torchvision: handy for tests and for running the same script without a GPU.

torchvision is imported only when a CUDA device is first used: the rest of energon never needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from energon.decode.image import IMAGE_MODES, decode_image
from energon.decode.jpeg import is_jpeg
from energon.decode.normalize import ImageNormalizer

__all__ = ["DeviceImageDecoder", "decode_images_on_device"]

_log = logging.getLogger(__name__)
_UINT8_RGB = IMAGE_MODES["torchrgb8"]
# JPEG start-of-frame markers nvJPEG decodes (baseline, extended, progressive Huffman, 8-bit);
# the colour space comes from the number of components and an Adobe marker.
_HUFFMAN_FRAMES = frozenset({0xC0, 0xC1, 0xC2})
_ADOBE_APP14 = 0xEE


def _jpeg_on_device(data: bytes | memoryview) -> bool:
    """Whether nvJPEG should get this image: an 8-bit Huffman JPEG with 1 or 3 components and no
    Adobe marker (which may announce CMYK/YCCK or RGB-coded colour: the CPU path decides those)."""
    if not is_jpeg(data):
        return False
    view = memoryview(data)
    position = 2
    while position + 4 <= len(view):
        if view[position] != 0xFF:
            return False
        if view[position + 1] == 0xFF:  # a fill byte before the marker
            position += 1
            continue
        marker = view[position + 1]
        length = (view[position + 2] << 8) | view[position + 3]
        if marker == _ADOBE_APP14:
            return False
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            segment = view[position + 4 : position + 4 + length - 2]
            if marker not in _HUFFMAN_FRAMES or len(segment) < 6:
                return False
            return segment[0] == 8 and segment[5] in (1, 3)
        position += 2 + length
    return False


def _import_decode_jpeg() -> Callable[..., Any]:
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as exc:
        raise ImportError(
            "decoding images on a CUDA device needs torchvision (its decode_jpeg uses nvJPEG): "
            "pip install torchvision (the build that matches your torch); or decode on the CPU "
            "with image_decode='torchrgb8'"
        ) from exc

    def decode(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)

    return decode


class DeviceImageDecoder:
    """Decodes a batch of encoded images (``image_decode="encoded"``) on ``device`` into one
    pad-stacked uint8 (N, 3, H, W) tensor there, or float through ``normalizer``.

    ``device``: ``"cuda"`` (the current CUDA device), ``"cuda:1"``, a ``torch.device``, or
    ``"cpu"`` (everything decoded by energon's CPU decoder). A CUDA device that is not available
    is an error at construction, not a silent fallback.
    ``normalizer``: an :class:`ImageNormalizer` applied to the stacked batch (None: uint8).

    :attr:`cpu_fallbacks` counts the images decoded on the CPU although the device is CUDA (not
    JPEG, or a JPEG nvJPEG refused); :attr:`device_images` those decoded on the device;
    :attr:`device_error` the last reason nvJPEG gave for refusing (also logged, once).
    """

    def __init__(
        self, device: torch.device | str = "cuda", normalizer: ImageNormalizer | None = None
    ) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"DeviceImageDecoder(device={str(device)!r}): CUDA is not available in this "
                "process (torch.cuda.is_available() is False); use device='cpu' or decode in the "
                "workers with image_decode='torchrgb8'"
            )
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(
                f"DeviceImageDecoder decodes on 'cuda' or 'cpu' devices, got {str(device)!r}"
            )
        self.normalizer = normalizer
        self.cpu_fallbacks = 0
        self.device_images = 0
        self.device_error: str | None = None  # the last reason nvJPEG refused images
        self._decode_jpeg = _import_decode_jpeg() if self.device.type == "cuda" else None

    def decode(self, images: Sequence[bytes | memoryview]) -> list[torch.Tensor]:
        """Each image as a uint8 (3, H, W) tensor on the device, in order."""
        images = _checked_images(images)
        out: list[torch.Tensor | None] = [None] * len(images)
        on_device = [i for i, data in enumerate(images) if self._decodes_on_device(data)]
        if on_device:
            for i, pixels in zip(on_device, self._decode_on_device([images[i] for i in on_device])):
                out[i] = pixels
        for i, pixels in enumerate(out):
            if pixels is None:
                out[i] = self._decode_on_cpu(images[i], i)
        return out  # type: ignore[return-value]

    def __call__(self, images: Sequence[bytes | memoryview]) -> torch.Tensor:
        """The batch as one (N, 3, H_max, W_max) tensor on the device: uint8 pad-stacked like
        ``torchrgb8`` batches, or the ``normalizer``'s float values."""
        stacked = pad_stack(self.decode(images), self.device)
        return self.normalizer(stacked) if self.normalizer is not None else stacked

    def _decodes_on_device(self, data: bytes | memoryview) -> bool:
        return self._decode_jpeg is not None and _jpeg_on_device(data)

    def _decode_on_device(self, images: list[bytes | memoryview]) -> list[torch.Tensor | None]:
        """nvJPEG in one batched call; if it refuses the batch, image by image (None: refused)."""
        tensors = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in images]
        try:
            decoded: list[torch.Tensor | None] = list(self._decode_jpeg(tensors, self.device))
        except RuntimeError as exc:
            self._refused(exc, len(tensors))
            decoded = [self._decode_one_on_device(tensor) for tensor in tensors]
        self.device_images += sum(pixels is not None for pixels in decoded)
        return decoded

    def _decode_one_on_device(self, tensor: torch.Tensor) -> torch.Tensor | None:
        try:
            return self._decode_jpeg([tensor], self.device)[0]
        except RuntimeError as exc:
            self._refused(exc, 1)
            return None

    def _refused(self, exc: RuntimeError, count: int) -> None:
        """Remember (and log once) why nvJPEG refused: a systematic failure must show."""
        if self.device_error is None:
            _log.warning("nvJPEG refused %d image(s), decoding them on the CPU: %s", count, exc)
        self.device_error = f"{type(exc).__name__}: {exc}"

    def _decode_on_cpu(self, data: bytes | memoryview, index: int) -> torch.Tensor:
        if self.device.type != "cpu":
            self.cpu_fallbacks += 1
        try:
            pixels = decode_image(data, _UINT8_RGB)
        except Exception as exc:
            raise ValueError(
                f"image {index} of the batch ({len(data)} bytes, starting {bytes(data[:8])!r}) "
                f"cannot be decoded: {type(exc).__name__}: {exc}"
            ) from exc
        return pixels.to(self.device, non_blocking=True)


def _checked_images(images: Sequence[bytes | memoryview]) -> Sequence[bytes | memoryview]:
    if isinstance(images, torch.Tensor) or not isinstance(images, Sequence):
        raise TypeError(
            "DeviceImageDecoder takes a batch's list of encoded images (image_decode='encoded'), "
            f"got {type(images).__name__}"
        )
    for index, data in enumerate(images):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"image {index} of the batch is {type(data).__name__}, not encoded bytes: load the "
                "dataset with image_decode='encoded'"
            )
    return images


def pad_stack(images: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """(N, C, H_max, W_max) uint8 on ``device``, each image top-left in its zeroed slot (the
    layout of the loader's pad-stacked batches)."""
    if not images:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8, device=device)
    height = max(image.shape[-2] for image in images)
    width = max(image.shape[-1] for image in images)
    out = torch.zeros((len(images), 3, height, width), dtype=torch.uint8, device=device)
    for slot, image in zip(out, images):
        slot[:, : image.shape[-2], : image.shape[-1]] = image
    return out


def decode_images_on_device(
    images: Sequence[bytes | memoryview],
    device: torch.device | str = "cuda",
    normalizer: ImageNormalizer | None = None,
) -> torch.Tensor:
    """``DeviceImageDecoder(device, normalizer)(images)``, for one call (keep a decoder to count
    its CPU fallbacks across batches)."""
    return DeviceImageDecoder(device, normalizer)(images)
