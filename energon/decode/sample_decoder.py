"""``SampleDecoder``: turns the raw bytes of a sample's parts into Python objects by extension.

The rules follow webdataset's auto-decoding as used by the reference (F95): a ``.gz`` suffix is
decompressed first, then image extensions (case-insensitive) are decoded with Pillow, audio/video
extensions go to the AV hook, a few basic extensions (case-sensitive) become str/int/json/arrays,
and anything else stays raw bytes. Unpickling is refused unless explicitly allowed, because a
dataset must never be able to run code in the training job by default. It is allowed per dataset
(``allow_pickle: true`` in its ``.nv-meta/dataset.yaml``), per process (the environment variable
``ENERGON_ALLOW_PICKLE=1``) or per decoder (``SampleDecoder(allow_pickle=True)``).

``decode_timeout`` bounds the decoding of each part (see ``energon.deadline``): a part that takes
longer raises ``DecodeTimeoutError``, which the loader's error policy handles like any bad sample.
Audio/video parts are decoded lazily by default (an ``AVDecoder``), so most of their decoding
happens later, in the task encoder; the same timeout is handed to each ``AVDecoder`` and bounds
each of its calls there too.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from energon.deadline import DecodeTimeoutError, deadline
from energon.decode.image import IMAGE_EXTENSIONS, IMAGE_MODES, ImageMode, decode_image
from energon.decode.sniff import guess_extension
from energon.errors import SYSTEM_EXCEPTIONS, DecodeError
from energon.format.layout import DATASET_YAML_FILENAME, MAIN_FOLDER_NAME
from energon.observe import probe as _probe
from energon.observe.probe import DECODE, STAGE

__all__ = [
    "AV_DECODE_MODES",
    "AV_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "DecodeError",
    "SampleDecoder",
]

#: Extensions (lower case) handed to the audio/video hook: the reference's list plus the common
#: m4v/m4a/aac/ogg, which the reference leaves as raw bytes.
AV_EXTENSIONS: frozenset[str] = frozenset(
    "mp4 avi mov webm mkv flac mp3 wav flv m4v ogg m4a aac".split()
)
#: AV extensions that hold a video track (``av_decode="torch"`` decodes the video of these).
VIDEO_EXTENSIONS: frozenset[str] = frozenset("mp4 avi mov webm mkv m4v flv".split())
#: Accepted ``av_decode`` values.
AV_DECODE_MODES: tuple[str, ...] = ("AVDecoder", "torch", "pyav")

_PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl"})
#: Set to 1 (or true/yes) to allow unpickling in this process, for every dataset.
ALLOW_PICKLE_ENV = "ENERGON_ALLOW_PICKLE"
_UNSUPPORTED = {
    "ten": "tenbin",
    "tb": "tenbin",
    "mp": "msgpack",
    "msg": "msgpack",
    "cbor": "CBOR",
}


def _decode_text(data: bytes | memoryview) -> str:
    return str(data, "utf-8")


def _decode_int(data: bytes | memoryview) -> int:
    return int(bytes(data))


def _decode_json(data: bytes | memoryview) -> Any:
    return json.loads(bytes(data))


def _decode_npy(data: bytes | memoryview) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _decode_npz(data: bytes | memoryview) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


class SampleDecoder:
    """Decodes the parts of a raw sample by their extension (the text after the last dot of the
    part name, e.g. ``jpg`` for part ``jpg`` or ``img.jpg``).

    ``image_decode``: one of ``IMAGE_MODES`` (default ``torchrgb``: float32 (3, H, W) in [0, 1]).
    ``av_decode``: ``"AVDecoder"`` (default), ``"torch"`` or ``"pyav"``; see ``decode_av``.
    ``video_decode_audio``: also decode the audio track of videos (for ``av_decode="torch"``).
    ``decode_timeout``: seconds one part may take to decode (None: unbounded); also the per-call
    timeout of the lazy ``AVDecoder`` objects it creates.
    ``guess_content``: pick the decoder from the content's magic bytes when recognised.
    ``allow_pickle``: decode ``pyd``/``pickle``/``pkl`` parts and allow full ``torch.load`` of
    ``pth`` parts. Off by default because unpickling untrusted data runs arbitrary code (see the
    module docstring for the per-dataset and per-process switches).
    """

    def __init__(
        self,
        *,
        image_decode: str = "torchrgb",
        av_decode: str = "AVDecoder",
        video_decode_audio: bool = False,
        guess_content: bool = False,
        allow_pickle: bool = False,
        decode_timeout: float | None = None,
    ) -> None:
        if image_decode not in IMAGE_MODES:
            raise ValueError(
                f"Unknown image_decode {image_decode!r}; choose one of {', '.join(IMAGE_MODES)}"
            )
        if av_decode not in AV_DECODE_MODES:
            raise ValueError(
                f"Unknown av_decode {av_decode!r}; choose one of {', '.join(AV_DECODE_MODES)}"
            )
        self.image_decode = image_decode
        self.av_decode = av_decode
        self.video_decode_audio = video_decode_audio
        self.guess_content = guess_content
        self.allow_pickle = allow_pickle
        if decode_timeout is not None and decode_timeout <= 0:
            raise ValueError(f"decode_timeout must be positive or None, got {decode_timeout!r}")
        self.decode_timeout = decode_timeout
        self._image_mode: ImageMode = IMAGE_MODES[image_decode]
        self._basic: dict[str, Callable[[bytes | memoryview], Any]] = self._basic_handlers()

    def _basic_handlers(self) -> dict[str, Callable[[bytes | memoryview], Any]]:
        """Case-sensitive extension -> decoder for the non-media formats."""
        handlers: dict[str, Callable[[bytes | memoryview], Any]] = {}
        for ext in ("txt", "text", "transcript"):
            handlers[ext] = _decode_text
        for ext in ("cls", "cls2", "index", "inx", "id"):
            handlers[ext] = _decode_int
        for ext in ("json", "jsn"):
            handlers[ext] = _decode_json
        handlers["npy"] = _decode_npy
        handlers["npz"] = _decode_npz
        return handlers

    def pickle_allowed(self, dataset_allows: bool = False) -> bool:
        """Unpickling is allowed by the decoder, the dataset or the process environment."""
        env = os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower()
        return self.allow_pickle or dataset_allows or env in ("1", "true", "yes")

    def _decode_pickled(
        self, extension: str, data: bytes | memoryview, allowed: bool, dataset: str | None
    ) -> Any:
        if extension == "pth":  # weights_only restricts unpickling to tensors and containers
            return torch.load(io.BytesIO(data), weights_only=not allowed)
        if not allowed:
            where = (
                f"{dataset}/{MAIN_FOLDER_NAME}/{DATASET_YAML_FILENAME}"
                if dataset
                else "the dataset's dataset.yaml"
            )
            raise ValueError(
                f"refusing to unpickle a '.{extension}' part: pickle data can run arbitrary code. "
                f"If you trust this dataset, allow it with one of: `allow_pickle: true` in {where} "
                f"(this dataset), the environment variable {ALLOW_PICKLE_ENV}=1 (this process), or "
                "SampleDecoder(allow_pickle=True) as the task encoder's decoder"
            )
        return pickle.loads(data)

    def decode_av(self, extension: str, data: bytes | memoryview, name: str = "media") -> Any:
        """Audio/video parts, by ``av_decode``.

        ``"AVDecoder"``: a lazy :class:`energon.av.AVDecoder` holding the bytes; its headers are
        checked now, so unreadable media fails here (with the sample's location) rather than later
        in user code. ``"torch"``: an :class:`energon.av.AVData` with everything decoded (video of
        video files, plus their audio with ``video_decode_audio``; audio of audio files).
        ``"pyav"``: an opened PyAV input container.
        """
        if self.av_decode == "pyav":
            from energon.av._pyav import import_av

            return import_av().open(io.BytesIO(data))
        from energon.av import AVDecoder

        decoder = AVDecoder(data, timeout=self.decode_timeout, name=name)
        if self.av_decode == "AVDecoder":
            decoder.check()
            return decoder
        if extension in VIDEO_EXTENSIONS and decoder.has_video_stream():
            return decoder.get_frames(video_decode_audio=self.video_decode_audio)
        return decoder.get_audio() if decoder.has_audio_stream() else None

    def decode_part(
        self,
        part_name: str,
        data: bytes | memoryview,
        *,
        key: str | None = None,
        dataset: str | None = None,
        dataset_allows_pickle: bool = False,
    ) -> Any:
        """Decode one part by the extension of its name.

        ``dataset`` (its root) names the dataset in messages; ``dataset_allows_pickle`` is its
        ``dataset.yaml`` switch. Raises ``DecodeError`` naming the part (and ``key``, the sample
        key, when given), with the original exception as its cause.
        """
        name = part_name
        label = f"{key}.{part_name}" if key is not None else part_name
        hot = _probe.HOT  # probe.switch / probe.back inlined: this runs for every part
        previous_stage = hot[STAGE]
        hot[STAGE] = DECODE
        if _probe.TIMING:
            _probe.ACTIVE.switched(previous_stage)
        try:
            with deadline(self.decode_timeout, f"decoding {label}"):
                if name.endswith(".gz") or name == "gz":
                    data = gzip.decompress(data)
                    name = name[:-3]
                extension = name.rpartition(".")[2]
                if self.guess_content:
                    extension = guess_extension(data) or extension
                if extension in _PICKLE_EXTENSIONS or extension == "pth":
                    allowed = self.pickle_allowed(dataset_allows_pickle)
                    return self._decode_pickled(extension, data, allowed, dataset)
                return self._dispatch(extension, data, label)
        except (*SYSTEM_EXCEPTIONS, DecodeTimeoutError):
            raise
        except Exception as exc:
            raise DecodeError(f"{type(exc).__name__}: {exc}", part_name=part_name, key=key) from exc
        finally:
            hot[STAGE] = previous_stage
            if _probe.TIMING:
                _probe.ACTIVE.switched(DECODE)

    def _dispatch(self, extension: str, data: bytes | memoryview, label: str) -> Any:
        handler = self._basic.get(extension)  # text, numbers, JSON, numpy: never media names
        if handler is not None:
            return handler(data)
        lowered = extension.lower()
        if lowered in IMAGE_EXTENSIONS:
            return decode_image(data, self._image_mode)
        if lowered in AV_EXTENSIONS:
            return self.decode_av(lowered, data, label)
        if extension in _UNSUPPORTED:
            raise ValueError(
                f"{_UNSUPPORTED[extension]} parts ('.{extension}') are not supported; decode them "
                "yourself (set the task encoder's decoder to None to receive raw bytes)"
            )
        return bytes(data) if isinstance(data, memoryview) else data

    def decode(self, fname: str, raw: bytes | memoryview) -> Any:
        """Decode a single file by its name (``dir/000123.jpg`` -> extension ``jpg``); names
        without a dot stay raw bytes."""
        base = fname.rpartition("/")[2]
        if "." not in base:
            return bytes(raw) if isinstance(raw, memoryview) else raw
        return self.decode_part(base.partition(".")[2], raw)

    def __call__(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        """Decode every part of a raw sample dict; ``__key__``-style entries stay untouched."""
        key = parts.get("__key__")
        out: dict[str, Any] = {}
        for name, value in parts.items():
            if name.startswith("__") or not isinstance(value, (bytes, memoryview)):
                out[name] = value
            else:
                out[name] = self.decode_part(name, value, key=key)
        return out

    def config(self) -> dict[str, Any]:
        """Plain-data description (for dataset config dumps and state fingerprints)."""
        out: dict[str, Any] = {
            "type": type(self).__qualname__,
            "image_decode": self.image_decode,
            "av_decode": self.av_decode,
            "video_decode_audio": self.video_decode_audio,
            "guess_content": self.guess_content,
            "allow_pickle": self.allow_pickle,
        }
        if self.decode_timeout is not None:  # only when set: older configs stay comparable
            out["decode_timeout"] = self.decode_timeout
        return out

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({options})"
