"""The cost of a sample, from what its index knows (no data read).

A cost function maps a :class:`~energon.source.meta.SampleMeta` (part byte sizes, media metadata
written by ``energon prepare --media-metadata-*``, token counts of token datasets) to a
:class:`SampleCost`: the sample's estimated sequence length in tokens and its compute cost. Costs
must be additive over samples: the cost of a rank's step is the sum of its samples' costs. With
variable-length attention over packed sequences (``cu_seqlens``) that holds for attention too: a
member attends only within itself, so its attention cost is quadratic in its own length.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Protocol, runtime_checkable

from energon.errors import BalanceCostError
from energon.format.media_metadata import AVMetadata, ImageMetadata
from energon.source.meta import SampleMeta

TEXT_EXTENSIONS = frozenset({"txt", "text", "json", "jsonl", "md", "cls", "html"})
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"})
VIDEO_EXTENSIONS = frozenset({"mp4", "mkv", "webm", "avi", "mov", "m4v"})
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "m4a", "aac"})


class SampleCost(NamedTuple):
    tokens: int  # estimated sequence length (text + vision + audio tokens)
    cost: float  # compute cost (any unit; only ratios between samples matter)


@runtime_checkable
class CostFunction(Protocol):
    """Maps a sample's metadata to its cost. It must be deterministic (every rank computes it)
    and should be cheap (it runs for every sample of every global step on every rank)."""

    def __call__(self, meta: SampleMeta) -> SampleCost: ...


def _extension(part: str) -> str:
    return part.rsplit(".", 1)[-1].lower()


@dataclasses.dataclass(frozen=True)
class MultimodalCost:
    """The built-in cost: text tokens + vision tokens + frame tokens, plus attention.

    - text: a token dataset's token count, else the bytes of text parts / ``bytes_per_token``;
    - images: ``ceil(w / patch) * ceil(h / patch)`` tokens each (capped at
      ``max_image_tokens``) from the media metadata; without metadata, the image's bytes /
      ``image_bytes_per_token``;
    - video: ``ceil(frames / frame_stride) * tokens_per_frame`` (frames from the metadata, or
      duration x fps); audio: ``audio_tokens_per_second`` x duration;
    - cost = ``tokens + attention_weight * tokens**2``: linear layers scale with the tokens,
      variable-length attention with the square of each member's length.
    """

    bytes_per_token: float = 4.0
    patch: int = 28
    max_image_tokens: int = 1280
    image_bytes_per_token: float = 64.0
    frame_stride: int = 2
    tokens_per_frame: int = 64
    audio_tokens_per_second: float = 25.0
    attention_weight: float = 1.0 / 4096

    def __call__(self, meta: SampleMeta) -> SampleCost:
        tokens = self.tokens(meta)
        return SampleCost(tokens, self.cost_of_tokens(tokens))

    def cost_of_tokens(self, tokens: int) -> float:
        """The cost of a sequence of ``tokens`` tokens (how :class:`~energon.balance.Balance`
        costs the part of an over-long sample that is trained on)."""
        return tokens + self.attention_weight * tokens * tokens

    def tokens(self, meta: SampleMeta) -> int:
        return sum(self.token_counts(meta))

    def token_counts(self, meta: SampleMeta) -> tuple[int, int]:
        """(text tokens, media tokens: image patches, video frames and audio) of a sample."""
        known = meta.tokens
        text = int(known) if known is not None else 0
        media = meta.media
        vision = 0
        for part, size in meta.part_sizes.items():
            ext = _extension(part)
            info = media.get(part)
            if known is None and ext in TEXT_EXTENSIONS:
                text += math.ceil(size / self.bytes_per_token)
            elif isinstance(info, ImageMetadata):
                vision += self.image_tokens(info.width, info.height)
            elif isinstance(info, AVMetadata):
                vision += self.av_tokens(info)
            elif ext in IMAGE_EXTENSIONS:
                vision += min(self.max_image_tokens, math.ceil(size / self.image_bytes_per_token))
        return text, vision

    def image_tokens(self, width: int, height: int) -> int:
        n = math.ceil(width / self.patch) * math.ceil(height / self.patch)
        return min(self.max_image_tokens, n)

    def av_tokens(self, info: AVMetadata) -> int:
        tokens = 0
        frames = info.video_num_frames
        if frames is None and info.video_duration and info.video_fps:
            frames = round(info.video_duration * info.video_fps)
        if frames:
            tokens += math.ceil(frames / self.frame_stride) * self.tokens_per_frame
        if info.audio_duration:
            tokens += math.ceil(info.audio_duration * self.audio_tokens_per_second)
        return tokens

    def config(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def cost_config(fn: CostFunction) -> dict[str, Any]:
    """What identifies a cost function in a state's fingerprint: its class and, when it says, its
    parameters (a different cost function means a different split of the steps)."""
    own = getattr(fn, "config", None)
    name = f"{type(fn).__module__}.{type(fn).__qualname__}"
    if type(fn).__name__ == "function":
        name = f"{fn.__module__}.{fn.__qualname__}"  # type: ignore[attr-defined]
    return {"type": name, **({"params": own()} if callable(own) else {})}


def trained_cost(fn: CostFunction, cost: SampleCost, max_length: int, over_length: str) -> float:
    """The cost of what is trained on of a sample estimated at ``cost``: an over-long one
    (``tokens > max_length``) is truncated to ``max_length`` tokens, split into chunks of at most
    ``max_length`` (each attends only within itself) or dropped (nothing), as the packer does.
    A cost function with ``cost_of_tokens(n)`` prices the parts exactly; otherwise the cost is
    scaled by the tokens kept."""
    tokens = cost.tokens
    if tokens <= max_length:
        return cost.cost
    if over_length == "drop":
        return 0.0
    chunks = [max_length] if over_length == "truncate" else _chunks(tokens, max_length)
    of_tokens = getattr(fn, "cost_of_tokens", None)
    if callable(of_tokens):
        return float(sum(of_tokens(n) for n in chunks))
    return cost.cost * sum(chunks) / tokens


def _chunks(tokens: int, max_length: int) -> list[int]:
    full, rest = divmod(tokens, max_length)
    return [max_length] * full + ([rest] if rest else [])


MISSING_FIELD_ERRORS = (AttributeError, KeyError, TypeError, IndexError)


def cost_failure(exc: BaseException, needed_by: str, key: str | None, dataset: str) -> Exception:
    """The one-line error for ``exc``, raised by ``needed_by`` on sample ``key`` of ``dataset``
    (the field: the attribute or item that was missing, where the exception says)."""
    field = None
    if isinstance(exc, AttributeError):
        field = exc.name
    elif isinstance(exc, KeyError) and exc.args:
        field = exc.args[0]
    what = f"lacks field {field!r}, which" if field is not None else "cannot be costed:"
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return BalanceCostError(
        f"balance: sample {key!r} of dataset {dataset!r} {what} {needed_by} needs "
        f"({type(exc).__name__}: {detail})"
    )


def cost_name(fn: object) -> str:
    """How an error names a cost function: its class, or a plain function's name."""
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def dataset_name(leaf: object) -> str:
    """The dataset a leaf reads (its root, file or name)."""
    for attr in ("root", "path", "name"):
        value = getattr(leaf, attr, None)
        if value is not None:
            return str(value)
    return type(leaf).__name__
