"""Media metadata: image sizes and audio/video durations, rates and sizes stored at preparation
time in ``index.sqlite``, so cookers and task encoders can plan clips without decoding."""

from energon.format.media_metadata import (
    AVMetadata,
    ImageMetadata,
    MediaMetadata,
    MediaMetadataType,
    deserialize_media_metadata,
    serialize_media_metadata,
)
from energon.media.extract import MediaFilterConfig, MediaFilterStrategy, extract_media_metadata
from energon.media.store import MediaMetadataReader, get_media_metadata

__all__ = [
    "AVMetadata",
    "ImageMetadata",
    "MediaFilterConfig",
    "MediaFilterStrategy",
    "MediaMetadata",
    "MediaMetadataReader",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "extract_media_metadata",
    "get_media_metadata",
    "serialize_media_metadata",
]
