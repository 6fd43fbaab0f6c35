"""Torch RGB images whose planar copy is left to the batch (decode into batch memory).

A default ``torchrgb`` image is float32 (3, H, W): four bytes per subpixel, written once per
sample and read again when the batch is pad-stacked (a ``torchrgb8`` image likewise, one byte per
subpixel). When nothing but the library's own batching
sees the decoded samples (no ``encode_sample`` of the user's, no packing or grouping, the default
``batch``: see ``energon.pipeline.stream``), the load stage lets the image decoder return a
:class:`PendingImage` instead: the decoder's uint8 (H, W, 3) pixels in a pooled buffer. The batch
(``energon.samples.collate.batch_pad_stack``) then writes each image (as ``v / 255`` for
float) straight into its padded slot of the batch tensor (in a worker, in the shared-memory arena), zeroing the
padding in the same pass. The batch's values are exactly those of the per-sample path.

A PendingImage never reaches the user: the batch stage turns any that a batch still holds into
the float tensor the decoder would have returned (:func:`materialize_pending`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np
import torch

from energon.decode.planar import to_padded_planar, to_planar
from energon.memory.buffer_pool import numpy_dtype, pooled_empty

__all__ = ["PendingImage", "any_pending", "materialize_pending"]

# Every PendingImage of this process that is still alive: while there is none (text, or images
# the fast path does not take), the batch stage need not look through its batches for them.
_alive: weakref.WeakSet[PendingImage] = weakref.WeakSet()


class PendingImage:
    """uint8 (H, W, C) pixels standing for the (C, H, W) tensor of ``dtype``: float32
    ``pixels / 255`` or uint8 ``pixels``. ``pixels`` is None only inside the load stage, while a
    decode thread is filling it in (:mod:`energon.decode.threads`)."""

    __slots__ = ("pixels", "dtype", "threads", "__weakref__")
    device = torch.device("cpu")

    def __init__(
        self, pixels: np.ndarray | None, dtype: torch.dtype = torch.float32, threads: int = 1
    ) -> None:
        if dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"a PendingImage stands for a float32 or uint8 tensor, not {dtype}")
        self.pixels = pixels
        self.dtype = dtype
        self.threads = threads  # decoded on this many threads: its batch is written on as many
        _alive.add(self)

    @property
    def shape(self) -> torch.Size:
        height, width, channels = self.pixels.shape
        return torch.Size((channels, height, width))

    def dim(self) -> int:
        return 3

    def materialize(self) -> torch.Tensor:
        """The tensor the decoder returns without deferral."""
        height, width, channels = self.pixels.shape
        out = pooled_empty((channels, height, width), numpy_dtype(self.dtype))
        return torch.from_numpy(to_planar(self.pixels, out))

    def write_padded(self, slot: np.ndarray) -> None:
        """Write the image into the corner of ``slot`` (C, h, w) of its dtype; zero the rest."""
        to_padded_planar(self.pixels, slot)

    def __repr__(self) -> str:
        return f"PendingImage(shape={tuple(self.shape)})"


def any_pending() -> bool:
    """Whether a PendingImage exists in this process (one may then be inside a batch)."""
    return bool(_alive)


def materialize_pending(value: Any) -> Any:
    """``value`` with every PendingImage inside it (containers, dataclasses) made a tensor."""
    if isinstance(value, PendingImage):
        return value.materialize()
    if isinstance(value, (torch.Tensor, str, bytes, int, float, np.ndarray)) or value is None:
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = materialize_pending(item)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = materialize_pending(item)
        return value
    if isinstance(value, tuple):
        items = [materialize_pending(item) for item in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            item = getattr(value, field.name, None)
            new = materialize_pending(item)
            if new is not item:
                object.__setattr__(value, field.name, new)
    return value
