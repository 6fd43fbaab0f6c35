"""Uniformly spaced clips and frames: the usual way to sample a video for training."""

from __future__ import annotations

import numpy as np
import torch

from energon.av.data import AVData
from energon.av.decoder import AVDecoder

__all__ = ["get_clips_uniform", "get_single_frames_uniform"]


def _usable_duration(decoder: AVDecoder, video: bool, audio: bool) -> float:
    """The length all requested streams share (audio and video may differ slightly)."""
    durations = []
    if video:
        durations.append(decoder.get_video_duration()[0])
    if audio:
        durations.append(decoder.get_audio_duration())
    return min(durations)


def _clip_starts(total: float, clip_duration: float, num_clips: int, fps: float) -> np.ndarray:
    if clip_duration > 0:
        return np.linspace(0.0, max(0.0, total - clip_duration), num_clips)
    # single frames: sample the middle of frames, never the very first/last instant
    half_frame = 0.5 / fps if fps > 0 else 0.0
    return np.linspace(half_frame, max(half_frame, total - half_frame), num_clips)


def get_clips_uniform(
    av_decoder: AVDecoder,
    clip_duration_seconds: float,
    num_clips: int,
    request_video: bool = False,
    request_audio: bool = False,
    video_out_frame_size: tuple[int, int] | None = None,
) -> AVData:
    """``num_clips`` clips of ``clip_duration_seconds`` spread evenly from the start to the end.

    The first clip starts at 0, the last one ends at the end of the shorter requested stream.
    A duration of 0 gives single frames (sampled at frame centres).
    """
    if not (request_video or request_audio):
        raise ValueError("get_clips_uniform: request_video and/or request_audio must be True")
    if num_clips < 1 or clip_duration_seconds < 0:
        raise ValueError("get_clips_uniform: need num_clips >= 1 and clip_duration_seconds >= 0")
    total = _usable_duration(av_decoder, request_video, request_audio)
    fps = av_decoder.get_video_fps() if request_video else 0.0
    starts = _clip_starts(total, clip_duration_seconds, num_clips, fps)
    ranges = [(float(s), float(s) + clip_duration_seconds) for s in starts]
    return av_decoder.get_clips(
        video_clip_ranges=ranges if request_video else None,
        audio_clip_ranges=ranges if request_audio else None,
        video_out_frame_size=video_out_frame_size,
    )


def get_single_frames_uniform(
    av_decoder: AVDecoder,
    num_frames: int,
    *,
    video_out_frame_size: tuple[int, int] | None = None,
    return_timestamps: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, list[float]]:
    """``num_frames`` evenly spaced frames as one uint8 tensor (num_frames, 3, H, W)
    (plus each frame's start time in seconds if ``return_timestamps``)."""
    data = get_clips_uniform(
        av_decoder,
        0.0,
        num_frames,
        request_video=True,
        video_out_frame_size=video_out_frame_size,
    )
    clips = data.video_clips or []
    if not clips:
        raise ValueError(f"get_single_frames_uniform: {av_decoder!r} returned no frames")
    frames = torch.stack([clip[0] for clip in clips])
    if return_timestamps:
        return frames, [start for start, _ in data.video_timestamps or []]
    return frames
