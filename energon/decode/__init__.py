"""Decoding of raw sample parts (images with Pillow, basic formats, AV hook) by extension."""

from energon.decode.device import DeviceImageDecoder, decode_images_on_device
from energon.decode.image import IMAGE_EXTENSIONS, IMAGE_MODES, decode_image
from energon.decode.normalize import ImageNormalizer, normalize_images
from energon.decode.sample_decoder import (
    AV_DECODE_MODES,
    AV_EXTENSIONS,
    DecodeError,
    SampleDecoder,
)
from energon.decode.sniff import guess_extension

__all__ = [
    "AV_DECODE_MODES",
    "AV_EXTENSIONS",
    "DecodeError",
    "DeviceImageDecoder",
    "IMAGE_EXTENSIONS",
    "IMAGE_MODES",
    "ImageNormalizer",
    "SampleDecoder",
    "decode_image",
    "decode_images_on_device",
    "guess_extension",
    "normalize_images",
]
