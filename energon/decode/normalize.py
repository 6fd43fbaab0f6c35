"""uint8 image batches made float on the device: the values of the default float path, exactly.

With ``image_decode="torchrgb8"`` the loader makes uint8 (N, 3, H, W) batches: a quarter of the
bytes of the default float32 ``torchrgb`` batches to write on the CPU, to send from the workers
and to copy to the accelerator. The conversion to float then runs on the device, after
``.to(device)``, with :class:`ImageNormalizer` (or :func:`normalize_images`).

Why a lookup table and not ``images.float() / 255``: the float path's values are the correctly
rounded float32 ``v / 255`` (what numpy, Pillow and the reference give). Torch divides a CUDA
tensor by a Python number as a multiplication by ``1 / 255``, which differs in the last bit for
126 of the 256 values. Here every pixel is looked up in a table of the 256 float32 values computed
once on the CPU, so the result does not depend on how a device divides. With ``mean`` and ``std``
the table is normalized instead, on the device, with the same operations a per-pixel
normalization does, so the result equals ``(float_images - mean) / std`` there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["ImageNormalizer", "normalize_images"]

_UINT8_VALUES = 256
_UINT8_MAX = np.float32(255)


def _unit_table() -> torch.Tensor:
    """The 256 float32 values ``v / 255`` (correctly rounded), as the float decode path makes."""
    return torch.from_numpy(np.arange(_UINT8_VALUES, dtype=np.float32) / _UINT8_MAX)


def _channel_values(
    values: Sequence[float] | torch.Tensor | None, name: str
) -> torch.Tensor | None:
    if values is None:
        return None
    tensor = torch.as_tensor(values, dtype=torch.float32).flatten()
    if tensor.numel() == 0:
        raise ValueError(f"{name} needs one value per channel (or one for all), got none")
    return tensor


class ImageNormalizer:
    """Turns uint8 images into float images on their own device: ``v / 255``, then optionally
    ``(x - mean) / std`` per channel, as one table lookup per pixel.

    ``images`` may have any shape; with ``mean`` / ``std`` the channels are dimension -3
    ((N, C, H, W) batches or (C, H, W) images) and each has one value per channel (or a single
    value for all). The result:

    * without ``mean`` / ``std``: bit for bit the float32 ``torchrgb`` value of each pixel;
    * with them: bit for bit ``(x - mean) / std`` computed by torch on the images' device from
      those float32 values, with ``mean`` and ``std`` float32 tensors of shape (C, 1, 1) there
      (what ``torchvision.transforms.v2.Normalize`` does);
    * in ``dtype`` (float32 by default): for another dtype each value is the float32 result
      converted, as ``.to(dtype)`` of the float32 result would be.

    The tables are made once per device and dtype. A pass needs a temporary int32 index of the
    images' size on the device.
    """

    def __init__(
        self,
        mean: Sequence[float] | torch.Tensor | None = None,
        std: Sequence[float] | torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("ImageNormalizer needs both mean and std, or neither")
        if not dtype.is_floating_point:
            raise ValueError(f"ImageNormalizer makes floating-point images, not {dtype}")
        self.mean = _channel_values(mean, "mean")
        self.std = _channel_values(std, "std")
        if self.mean is not None and self.std is not None:
            if self.mean.numel() != self.std.numel():
                raise ValueError(
                    f"mean has {self.mean.numel()} values and std {self.std.numel()}: "
                    "give one per channel for both"
                )
        self.dtype = dtype
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
            kind = images.dtype if isinstance(images, torch.Tensor) else type(images).__name__
            raise TypeError(
                f"ImageNormalizer takes uint8 images (image_decode='torchrgb8'), got {kind}"
            )
        table = self.table(images.device)
        index = images.to(torch.int32)
        if table.dim() == 2:
            index += self._channel_offsets(images, table.shape[0])
        return table.flatten().index_select(0, index.flatten()).view(images.shape)

    def table(self, device: torch.device | str) -> torch.Tensor:
        """The output value of each uint8 value on ``device``: (256,) without normalization,
        (C, 256) with it (C = 1 when one mean and std serve all channels)."""
        device = torch.device(device)
        key = (device, self.dtype)
        table = self._tables.get(key)
        if table is None:
            table = self._make_table(device)
            self._tables[key] = table
        return table

    def _make_table(self, device: torch.device) -> torch.Tensor:
        table = _unit_table().to(device)
        if self.mean is not None and self.std is not None:
            mean = self.mean.to(device)[:, None]
            std = self.std.to(device)[:, None]
            table = (table[None, :] - mean) / std  # the per-pixel operations, one row a channel
        return table.to(self.dtype)

    @staticmethod
    def _channel_offsets(images: torch.Tensor, channels: int) -> torch.Tensor | int:
        """Each pixel's row in a (C, 256) table: its channel (dimension -3) times 256."""
        if channels == 1:
            return 0
        if images.dim() < 3 or images.shape[-3] != channels:
            raise ValueError(
                f"mean and std have {channels} values, but images of shape "
                f"{tuple(images.shape)} do not have {channels} channels in dimension -3"
            )
        offsets = torch.arange(channels, dtype=torch.int32, device=images.device)
        return (offsets * _UINT8_VALUES).view(channels, 1, 1)


def normalize_images(
    images: torch.Tensor,
    mean: Sequence[float] | torch.Tensor | None = None,
    std: Sequence[float] | torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``ImageNormalizer(mean, std, dtype)(images)``: for one call; keep an
    :class:`ImageNormalizer` to reuse its tables across batches."""
    return ImageNormalizer(mean, std, dtype)(images)
