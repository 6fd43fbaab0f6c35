"""Decoded PyAV frames as numpy arrays and torch tensors: RGB video frames, audio samples."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def video_frame_to_array(
    frame: Any, size: tuple[int, int] | None, reformatter: Any = None
) -> np.ndarray:
    """RGB (H, W, 3) uint8, resized to ``size`` = (width, height) if given.

    ``reformatter``: a PyAV ``VideoReformatter`` shared by the frames of one request. Each
    frame's own ``to_ndarray`` sets up a new swscale context, which for small frames costs
    more than the conversion itself; a shared one is set up once (same pixels).
    """
    if reformatter is None:
        if size is not None:
            frame = frame.reformat(
                width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
            )
        return frame.to_ndarray(format="rgb24")
    if size is None:
        return reformatter.reformat(frame, format="rgb24").to_ndarray()
    return reformatter.reformat(
        frame, width=size[0], height=size[1], format="rgb24", interpolation="BILINEAR"
    ).to_ndarray()


def arrays_to_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    """(F, 3, H, W) uint8 from (H, W, 3) RGB arrays.

    Each frame is copied once, transposed, into the output with numpy: torch's ``permute`` +
    ``contiguous`` would copy through torch's intra-op thread pool, which costs far more than
    the copy itself for small frames on a busy machine (and a ``np.stack`` first would copy
    twice).
    """
    height, width, channels = arrays[0].shape
    out = np.empty((len(arrays), channels, height, width), dtype=arrays[0].dtype)
    for i, array in enumerate(arrays):
        out[i] = array.transpose(2, 0, 1)
    return torch.from_numpy(out)


def audio_frame_to_array(frame: Any) -> np.ndarray:
    """(channels, samples) in the decoded sample format (planar or interleaved)."""
    array = frame.to_ndarray()
    if frame.format.is_planar:
        return array
    channels = len(frame.layout.channels)
    return array.reshape(-1, channels).T
