"""Media metadata records and their JSON form in ``index.sqlite`` (F14 layout).

A row stores ``metadata_type`` (``"image"`` or ``"av"``) and ``metadata_json``: the compact JSON
(``separators=(",", ":")``) of the record's fields that are not None, so files written by either
tool read back identically.
"""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from typing import Any, ClassVar

__all__ = [
    "AVMetadata",
    "ImageMetadata",
    "MediaMetadata",
    "MediaMetadataType",
    "deserialize_media_metadata",
    "serialize_media_metadata",
]


class MediaMetadataType(str, Enum):
    """The ``metadata_type`` column."""

    IMAGE = "image"
    AV = "av"

    @classmethod
    def from_string(cls, value: str) -> MediaMetadataType:
        """The type stored in a ``metadata_type`` column (exact, lower-case names)."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"Unsupported media metadata type: {value!r}") from None


@dataclasses.dataclass
class ImageMetadata:
    """Size and format of an image, read from its header (no pixel decoding)."""

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.IMAGE
    width: int
    height: int
    format: str = "UNKNOWN"
    mode: str = "UNKNOWN"


@dataclasses.dataclass
class AVMetadata:
    """Durations (seconds), rates and sizes of an audio/video file; None where not present."""

    metadata_type: ClassVar[MediaMetadataType] = MediaMetadataType.AV
    video_duration: float | None = None
    video_num_frames: int | None = None
    video_fps: float | None = None
    video_width: int | None = None
    video_height: int | None = None
    audio_duration: float | None = None
    audio_channels: int | None = None
    audio_sample_rate: int | None = None
    audio_num_samples: int | None = None


MediaMetadata = ImageMetadata | AVMetadata

_TYPES: dict[MediaMetadataType, type] = {
    MediaMetadataType.IMAGE: ImageMetadata,
    MediaMetadataType.AV: AVMetadata,
}


def metadata_type_of(metadata: MediaMetadata) -> MediaMetadataType:
    if isinstance(metadata, (ImageMetadata, AVMetadata)):
        return metadata.metadata_type
    raise TypeError(f"not a media metadata record: {type(metadata).__name__}")


def serialize_media_metadata(metadata: MediaMetadata) -> tuple[str, str]:
    """``(metadata_type, metadata_json)`` for an ``index.sqlite`` row."""
    fields = {k: v for k, v in dataclasses.asdict(metadata).items() if v is not None}
    return metadata_type_of(metadata).value, json.dumps(fields, separators=(",", ":"))


def deserialize_media_metadata(
    metadata_type: str | MediaMetadataType, metadata_json: str
) -> MediaMetadata:
    """The record stored in a row; unknown JSON keys (a newer writer) are ignored."""
    try:
        cls = _TYPES[MediaMetadataType(metadata_type)]
    except ValueError:
        raise ValueError(f"unknown media metadata type {metadata_type!r}") from None
    data: dict[str, Any] = json.loads(metadata_json)
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})
