"""Errors of audio/video decoding."""

from __future__ import annotations

from energon.errors import SampleException

__all__ = ["AVDecodeError"]


class AVDecodeError(SampleException):
    """Media could not be opened or decoded (corrupt, truncated, unsupported codec, bad request).

    A ``SampleException``, so the loader's error policy skips and counts (or raises) the sample
    instead of letting the worker die.
    """
