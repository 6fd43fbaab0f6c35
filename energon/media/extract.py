"""Which files get media metadata (the filter strategies of F14), and reading it from their bytes.

Extraction reads headers only where possible: Pillow's ``Image.open`` parses the image header
without decoding pixels; audio/video go through ``AVDecoder.get_metadata`` (header values, with
durations/frame counts computed by demuxing when the container lacks them; the audio sample count
decodes the audio). Files that cannot be parsed get no metadata (logged at debug level), so one
odd file never fails a whole preparation.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import logging
import os
from enum import Enum
from typing import BinaryIO

from energon.format.media_metadata import (
    AVMetadata,
    ImageMetadata,
    MediaMetadata,
    MediaMetadataType,
)

__all__ = [
    "AV_EXTENSIONS",
    "IMAGE_EXTENSIONS",
    "MediaFilterConfig",
    "MediaFilterStrategy",
    "extract_media_metadata",
]

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset("bmp gif ico j2k jp2 jpx jpeg jpg png tif tiff webp".split())
AV_EXTENSIONS = frozenset("aac avi flac m4a m4v mkv mov mp3 mp4 ogg wav webm".split())


class MediaFilterStrategy(str, Enum):
    """How files are selected (the ``strategy`` column of ``media_filters``)."""

    EXTENSION = "EXTENSION"
    HEADER = "HEADER"
    GLOB = "GLOB"


def _extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def _type_by_extension(name: str) -> MediaMetadataType | None:
    extension = _extension(name)
    if extension in IMAGE_EXTENSIONS:
        return MediaMetadataType.IMAGE
    if extension in AV_EXTENSIONS:
        return MediaMetadataType.AV
    return None


@dataclasses.dataclass(frozen=True)
class MediaFilterConfig:
    """A strategy and, for GLOB, its comma-separated patterns (matched on the lower-cased name)."""

    strategy: MediaFilterStrategy
    patterns: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, glob: str | None = None, header: bool = False, extension: bool = False
    ) -> MediaFilterConfig:
        """From the CLI options; exactly one of them must be given."""
        given = (glob is not None) + bool(header) + bool(extension)
        if given != 1:
            raise ValueError(
                "give exactly one of --media-metadata-by-glob, --media-metadata-by-header and "
                "--media-metadata-by-extension"
            )
        if glob is not None:
            patterns = tuple(p.strip().lower() for p in glob.split(",") if p.strip())
            if not patterns:
                raise ValueError("--media-metadata-by-glob needs at least one pattern")
            return cls(MediaFilterStrategy.GLOB, patterns)
        if header:
            return cls(MediaFilterStrategy.HEADER)
        return cls(MediaFilterStrategy.EXTENSION)

    @property
    def patterns_column(self) -> str:
        """The ``patterns`` column of ``media_filters`` (comma-joined globs, or empty)."""
        return ",".join(self.patterns)

    @property
    def needs_content(self) -> bool:
        """HEADER sniffs every file, so every file's bytes must be read."""
        return self.strategy is MediaFilterStrategy.HEADER

    def candidate_type(self, name: str) -> MediaMetadataType | None:
        """The media type to try for ``name`` without looking at its content (None: skip).

        For HEADER the answer is only a fallback; :meth:`media_type` decides with the content.
        """
        if self.strategy is MediaFilterStrategy.GLOB:
            lowered = name.lower()
            if not any(fnmatch.fnmatch(lowered, p) for p in self.patterns):
                return None
        return _type_by_extension(name)

    def media_type(self, name: str, data: bytes) -> MediaMetadataType | None:
        """The media type of a file, using its first bytes for HEADER."""
        if self.strategy is not MediaFilterStrategy.HEADER:
            return self.candidate_type(name)
        from energon.decode.sniff import guess_extension  # (importing energon.decode is heavy)

        sniffed = guess_extension(data)
        if sniffed is not None:
            found = _type_by_extension(f"x.{sniffed}")
            if found is not None:
                return found
        return _type_by_extension(name)

    # The reference's per-file API (scripts call it to test a filter on their own files).

    def should_consider_all(self) -> bool:
        """Whether every file must be read to decide (HEADER looks at the content)."""
        return self.needs_content

    def should_consider_media(self, name: str) -> bool:
        """Whether ``name`` passes the filter before its content is read."""
        if self.strategy is MediaFilterStrategy.HEADER:
            return True
        if self.strategy is MediaFilterStrategy.GLOB:
            return any(fnmatch.fnmatch(name.lower(), p) for p in self.patterns)
        return _type_by_extension(name) is not None

    def extract_metadata(
        self, source: bytes | str | os.PathLike | BinaryIO, filename: str | None = None
    ) -> MediaMetadata | None:
        """Metadata of one file (bytes, a path, or an open binary file; ``filename`` names the
        first and last), or None when the filter skips it or it cannot be parsed as media."""
        if isinstance(source, (str, os.PathLike)):
            filename = filename or os.path.basename(os.fspath(source))
        if filename is None:
            raise ValueError("extract_metadata needs filename= when the source is not a path")
        if not self.should_consider_media(filename):
            return None
        data = _read_source(source)
        media_type = self.media_type(filename, data)
        return None if media_type is None else extract_media_metadata(filename, data, media_type)


def _read_source(source: bytes | str | os.PathLike | BinaryIO) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    return source.read()


def _image_metadata(data: bytes) -> ImageMetadata:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return ImageMetadata(
            width=int(image.width),
            height=int(image.height),
            format=image.format or "UNKNOWN",
            mode=image.mode or "UNKNOWN",
        )


def _av_metadata(data: bytes, name: str) -> AVMetadata:
    from energon.av import AVDecoder

    return AVDecoder(data, name=name).get_metadata(get_audio_num_samples=True)


def extract_media_metadata(
    name: str, data: bytes, media_type: MediaMetadataType
) -> MediaMetadata | None:
    """Metadata of one file, or None if it cannot be parsed as ``media_type``."""
    try:
        if media_type is MediaMetadataType.IMAGE:
            return _image_metadata(data)
        return _av_metadata(data, name)
    except ImportError:
        raise  # PyAV missing: a setup problem, not a bad file
    except Exception as e:
        logger.debug("no media metadata for %s: %s: %s", name, type(e).__name__, e)
        return None
