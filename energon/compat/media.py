"""``megatron.energon.media`` (and ``.metadata``, ``.extractor``): media metadata under the
reference's names. ``MediaMetadataBase`` is the common base the reference gives ``ImageMetadata`` and
``AVMetadata``; energon's two record types are registered with it, so ``isinstance`` holds."""

from __future__ import annotations

import abc
from typing import Any

from energon.av import AVDecoder
from energon.compat.epathlib import EPath
from energon.format.media_metadata import (
    AVMetadata,
    ImageMetadata,
    MediaMetadataType,
    deserialize_media_metadata,
    serialize_media_metadata,
)
from energon.media.extract import MediaFilterConfig, MediaFilterStrategy
from energon.samples.edataclass import edataclass

__path__: list[str] = []  # a package for the alias: media.metadata / media.extractor map here

__all__ = [
    "AVDecoder",
    "AVMetadata",
    "EPath",
    "ImageMetadata",
    "MediaFilterConfig",
    "MediaFilterStrategy",
    "MediaMetadataBase",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "edataclass",
    "serialize_media_metadata",
]


class MediaMetadataBase(abc.ABC):
    """Metadata of one media file, stored as JSON in ``index.sqlite``."""

    metadata_type: MediaMetadataType

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Any:
        """The metadata object of its JSON representation."""
        return cls(**payload)

    def to_dict(self) -> dict[str, Any]:
        """The JSON representation."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


MediaMetadataBase.register(ImageMetadata)
MediaMetadataBase.register(AVMetadata)
