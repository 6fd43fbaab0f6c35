"""Media that real files have and encoders do not make by themselves (no tests here)."""

from __future__ import annotations

import io

import numpy as np

FPS = 30


def avi_with_a_dropped_frame(frames: int = 20) -> bytes:
    """An AVI whose header counts one frame more than can be decoded: muxers write an empty packet
    for a dropped frame (how real AVIs end up with e.g. 1892 frames in the header, 1891 decodable)."""
    import av

    buf = io.BytesIO()
    out = av.open(buf, "w", format="avi")
    stream = out.add_stream("mpeg4", rate=FPS)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 10, np.uint8), format="rgb24")
        frame.pts = i
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    dropped = av.Packet(b"")
    dropped.stream = stream
    dropped.pts = dropped.dts = frames
    dropped.time_base = stream.time_base
    out.mux(dropped)
    out.close()
    return buf.getvalue()
