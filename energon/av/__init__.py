"""Audio and video: the lazy ``AVDecoder`` (PyAV), decoded ``AVData`` and uniform clip sampling.

PyAV is optional: this package imports without it and raises an ImportError with an install hint
when media is first decoded.
"""

from energon.av.data import AVData
from energon.av.decoder import AVDecoder
from energon.av.errors import AVDecodeError
from energon.av.index import AVProbeIndex
from energon.av.uniform import get_clips_uniform, get_single_frames_uniform
from energon.deadline import DecodeTimeoutError

__all__ = [
    "AVData",
    "AVDecodeError",
    "AVDecoder",
    "AVProbeIndex",
    "DecodeTimeoutError",
    "get_clips_uniform",
    "get_single_frames_uniform",
]
