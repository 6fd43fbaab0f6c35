"""Errors of audio/video decoding."""

from __future__ import annotations

from energon.errors import AVDecodeError

__all__ = ["AVDecodeError"]
