"""The one place that imports PyAV and opens containers with bounded codec threading.

PyAV is an optional dependency (``pip install energon-loader[av]``); importing energon must work
without it, so it is only imported when media is actually decoded.
"""

from __future__ import annotations

import io
import os
from typing import Any

__all__ = ["DEFAULT_CODEC_THREADS", "import_av", "new_video_reformatter", "open_container"]

#: Codec threads per opened container. 1 (no codec threading) by default: several loader workers
#: each decoding with FFmpeg's automatic thread count would oversubscribe the CPU, and FFmpeg's
#: frame threads are a known source of deadlocks after ``fork``. Override per decoder with
#: ``AVDecoder(codec_threads=...)`` or globally with the ``ENERGON_AV_CODEC_THREADS`` variable.
DEFAULT_CODEC_THREADS: int = max(1, int(os.environ.get("ENERGON_AV_CODEC_THREADS", "1") or 1))


def import_av() -> Any:
    """``import av`` with an install hint instead of a bare ModuleNotFoundError."""
    try:
        import av
    except ImportError as e:
        raise ImportError(
            "Decoding audio/video needs PyAV: pip install 'energon-loader[av]' (or pip install av)"
        ) from e
    return av


def open_container(data: bytes, codec_threads: int) -> Any:
    """Open an in-memory container for reading, with codec threading limited on every stream.

    The threading options must be set before the first decode (codecs open lazily), so they are
    set here for all streams at once.
    """
    av = import_av()
    container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    for stream in container.streams:
        context = stream.codec_context
        if context is None:
            continue
        if codec_threads <= 1:
            context.thread_type = "NONE"
            context.thread_count = 1
        else:
            context.thread_type = "AUTO"
            context.thread_count = codec_threads
    return container


def new_video_reformatter() -> Any:
    """A PyAV ``VideoReformatter``: keeps its swscale context between frames of equal shape and
    format (a frame's own ``reformat``/``to_ndarray`` sets one up per frame)."""
    av = import_av()
    return av.video.reformatter.VideoReformatter()
