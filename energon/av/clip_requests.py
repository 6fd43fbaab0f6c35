"""The arguments of clip requests: checked, and turned into what the cursors take.

A bad argument is a programming error, not a broken sample: it raises :class:`_BadRequest`
(which :class:`~energon.av.decoder.AVDecoder` reports as a ``ValueError`` naming the call).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from energon.errors import EnergonError

VideoUnit = Literal["seconds", "frames"]
AudioUnit = Literal["seconds", "samples"]
ClipRange = tuple[float, float]


class _BadRequest(EnergonError, ValueError):
    """The caller asked for something invalid (a programming error, not a broken sample).

    A signal private to :mod:`energon.av`: the decoder turns it into a ``ValueError`` naming
    the call, so it never reaches users under this name."""


def check_unit(unit: str, allowed: tuple[str, ...]) -> None:
    if unit not in allowed:
        raise _BadRequest(f"unit must be one of {allowed}, got {unit!r}")


def check_size(size: Any) -> tuple[int, int] | None:
    if size is None:
        return None
    try:
        width, height = (int(v) for v in size)
    except (TypeError, ValueError):
        raise _BadRequest(f"video_out_frame_size must be (width, height), got {size!r}") from None
    if width <= 0 or height <= 0:
        raise _BadRequest(f"video_out_frame_size must be positive, got {size!r}")
    return width, height


def check_ranges(ranges: Sequence[ClipRange]) -> list[tuple[float, float]]:
    checked = []
    for item in ranges:
        try:
            start, end = (float(v) for v in item)
        except (TypeError, ValueError):
            raise _BadRequest(f"a clip range must be (start, end), got {item!r}") from None
        if math.isnan(start) or math.isnan(end) or end < start:
            raise _BadRequest(f"invalid clip range {item!r}: need start <= end")
        checked.append((start, end))
    return checked


def audio_request(start: float, end: float, unit: str, rate: int) -> tuple[int, int | None]:
    """(first sample, sample count or None for "to the end") of one audio range."""
    if unit == "samples":
        first = max(0, math.ceil(start))
        return first, None if math.isinf(end) else max(0, int(end) - first + 1)
    first = max(0, round(start * rate))
    return first, None if math.isinf(end) else round((end - max(0.0, start)) * rate)
