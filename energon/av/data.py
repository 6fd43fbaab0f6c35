"""``AVData``: decoded clips and their time spans, the result of the AV decoder's bulk methods."""

from __future__ import annotations

import torch

from energon.structs import edataclass

__all__ = ["AVData"]


@edataclass
class AVData:
    """Decoded audio/video clips.

    ``video_clips``: one uint8 tensor (frames, 3, H, W) RGB per clip; ``audio_clips``: one tensor
    (channels, samples) per clip, dtype as decoded (int16 for 16-bit PCM, float32 for AAC/Opus, ...).
    ``*_timestamps``: per clip ``(start, end)`` in seconds of what was actually returned: for video
    the first frame's start and the last frame's end, for audio the first and one past the last
    sample. ``None`` where that stream was not requested.
    """

    video_clips: list[torch.Tensor] | None = None
    video_timestamps: list[tuple[float, float]] | None = None
    audio_clips: list[torch.Tensor] | None = None
    audio_timestamps: list[tuple[float, float]] | None = None
