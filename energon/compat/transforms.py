"""``megatron.energon.transforms``: a chain of torchvision geometric transforms applied as ONE warp.

``MergeTransform([Resize(..), RandomCrop(..), RandomHorizontalFlip(), ...])`` maps each transform to
a :class:`TransformMapper` that turns it into a 3x3 matrix (source pixel coordinates -> destination
pixel coordinates, y pointing down, pixel ``i`` covering ``[i, i + 1)``) and a destination size
``[height, width]``. The matrices are multiplied and the image is resampled once, which is faster
and loses less detail than resampling after every step. Random parameters are drawn from torch's
global generator in the order torchvision's own ``forward`` draws them, so for the same seed the
result is what applying the transforms one after another gives (up to interpolation rounding; a
downscaling ``Resize`` is not antialiased by the single warp).

A user's own step subclasses :class:`CustomTransform` and implements ``apply_transform``. The
module imports without torchvision (the matrix helpers work); building a mapper or a
``MergeTransform`` without it raises ``ModuleNotFoundError`` saying what to install.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import PIL.Image
import torch

try:
    import torchvision.transforms as tv
    import torchvision.transforms.functional as tv_functional
except ImportError:  # also when the installed torchvision does not fit this torch
    tv = None
    tv_functional = None

__path__: list[str] = []  # a package for the alias: transforms.mappers/.custom/.merge/.common

__all__ = [
    "CenterCropMapper",
    "CustomTransform",
    "MergeTransform",
    "RandomCropMapper",
    "RandomHorizontalFlipMapper",
    "RandomPerspectiveMapper",
    "RandomResizedCropMapper",
    "RandomRotationMapper",
    "RandomVerticalFlipMapper",
    "ResizeMapper",
    "TransformMapper",
]

TTransform = TypeVar("TTransform")


def _require_torchvision() -> None:
    if tv is None:
        raise ModuleNotFoundError(
            "megatron.energon.transforms needs torchvision (a build that matches the installed "
            "torch, e.g. `pip install torch==2.14.1 torchvision==0.29.1`)",
            name="torchvision",
        )


class TransformMapper(ABC, Generic[TTransform]):
    """One step of a merged chain: ``apply_transform`` composes its matrix onto ``matrix``."""

    source_type: ClassVar[Any] = None  # the torchvision class this mapper stands for

    def __init__(self, transform: TTransform) -> None:
        _require_torchvision()
        self.transform = transform

    def __call__(self, sample: Any) -> Any:
        return self.transform(sample)

    @abstractmethod
    def apply_transform(
        self, matrix: np.ndarray, dst_size: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, Any]:
        """(new matrix, new ``[height, width]``, the drawn parameters for inspection)."""

    def fill(self) -> int | float | tuple | list | None:
        """The value of pixels outside the source (None: this step does not create any)."""
        return None

    def interpolation(self) -> Any:
        """The step's interpolation mode (None: it does not resample)."""
        return None

    # -- matrix helpers (image coordinates: x right, y down) --------------------------------
    @staticmethod
    def translate(x: float, y: float) -> np.ndarray:
        return np.array([[1.0, 0.0, x], [0.0, 1.0, y], [0.0, 0.0, 1.0]])

    @staticmethod
    def rotate(angle: float) -> np.ndarray:
        """Counter-clockwise on screen by ``angle`` radians (the y-axis points down)."""
        c, s = math.cos(angle), math.sin(angle)
        return np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])

    @staticmethod
    def scale(x: float, y: float) -> np.ndarray:
        return np.array([[x, 0.0, 0.0], [0.0, y, 0.0], [0.0, 0.0, 1.0]])

    @staticmethod
    def shear(x: float, y: float) -> np.ndarray:
        return np.array([[1.0, x, 0.0], [y, 1.0, 0.0], [0.0, 0.0, 1.0]])

    @staticmethod
    def hflip() -> np.ndarray:
        return np.array([[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])

    @staticmethod
    def vflip() -> np.ndarray:
        return np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]])


class CustomTransform(TransformMapper[TTransform]):
    """Base of a user's own step: subclass it and implement ``apply_transform`` (its own
    ``__init__`` need not call this one)."""

    def __init__(self, transform: Any = None) -> None:
        self.transform = transform


def _size_pair(size: Any) -> tuple[int, int]:
    """torchvision's size argument as (height, width)."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if len(size) == 1:
        return int(size[0]), int(size[0])
    return int(size[0]), int(size[1])


def _draw_uniform(low: float, high: float) -> float:
    return float(torch.empty(1).uniform_(float(low), float(high)).item())


def _as_image_shape(height: int, width: int) -> torch.Tensor:
    """A tensor of the given image size holding no memory (for torchvision's ``get_params``)."""
    return torch.empty(1, 1, 1).expand(1, int(height), int(width))


class ResizeMapper(TransformMapper[Any]):
    source_type = tv.Resize if tv is not None else None

    def _output_size(self, height: int, width: int) -> tuple[int, int]:
        size, max_size = self.transform.size, self.transform.max_size
        if not isinstance(size, numbers.Number) and len(size) == 2:
            return int(size[0]), int(size[1])
        requested = int(size if isinstance(size, numbers.Number) else size[0])
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = requested, int(requested * long / short)
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), int(max_size)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def apply_transform(self, matrix, dst_size):
        height, width = (int(v) for v in dst_size)
        new_h, new_w = self._output_size(height, width)
        matrix = self.scale(new_w / width, new_h / height) @ matrix
        size = self.transform.size
        return (
            matrix,
            np.array([new_h, new_w]),
            ("Resize", [size] if isinstance(size, int) else list(size)),
        )

    def interpolation(self):
        return self.transform.interpolation


class RandomResizedCropMapper(TransformMapper[Any]):
    source_type = tv.RandomResizedCrop if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        t = self.transform
        top, left, h, w = t.get_params(_as_image_shape(*dst_size), t.scale, t.ratio)
        out_h, out_w = _size_pair(t.size)
        matrix = self.scale(out_w / w, out_h / h) @ self.translate(-left, -top) @ matrix
        return matrix, np.array([out_h, out_w]), ("RandomResizedCrop", (top, left, h, w))

    def interpolation(self):
        return self.transform.interpolation


class CenterCropMapper(TransformMapper[Any]):
    source_type = tv.CenterCrop if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        height, width = (int(v) for v in dst_size)
        crop_h, crop_w = _size_pair(self.transform.size)
        top = int(round((height - crop_h) / 2.0))
        left = int(round((width - crop_w) / 2.0))
        matrix = self.translate(-left, -top) @ matrix
        return matrix, np.array([crop_h, crop_w]), ("CenterCrop", (-top, -left, crop_h, crop_w))


def _padding_sides(padding: Any) -> tuple[int, int, int, int]:
    """torchvision's padding argument as (left, top, right, bottom)."""
    if isinstance(padding, numbers.Number):
        return (int(padding),) * 4
    if len(padding) == 1:
        return (int(padding[0]),) * 4
    if len(padding) == 2:
        return int(padding[0]), int(padding[1]), int(padding[0]), int(padding[1])
    return tuple(int(p) for p in padding)  # type: ignore[return-value]


class RandomCropMapper(TransformMapper[Any]):
    source_type = tv.RandomCrop if tv is not None else None

    def __init__(self, transform: Any) -> None:
        super().__init__(transform)
        if transform.padding_mode != "constant":
            raise ValueError(
                f"RandomCrop(padding_mode={transform.padding_mode!r}) cannot be merged into one "
                "warp (only constant padding can)"
            )

    def apply_transform(self, matrix, dst_size):
        t = self.transform
        height, width = (int(v) for v in dst_size)
        crop_h, crop_w = _size_pair(t.size)
        shift_x = shift_y = 0
        if t.padding is not None:
            left, top, right, bottom = _padding_sides(t.padding)
            shift_x, shift_y = left, top
            width, height = width + left + right, height + top + bottom
        if t.pad_if_needed and width < crop_w:
            shift_x += crop_w - width
            width += 2 * (crop_w - width)
        if t.pad_if_needed and height < crop_h:
            shift_y += crop_h - height
            height += 2 * (crop_h - height)
        top, left, _, _ = t.get_params(_as_image_shape(height, width), (crop_h, crop_w))
        matrix = self.translate(shift_x - left, shift_y - top) @ matrix
        return matrix, np.array([crop_h, crop_w]), ("RandomCrop", (left, top, crop_h, crop_w))

    def fill(self):
        return self.transform.fill


class RandomHorizontalFlipMapper(TransformMapper[Any]):
    source_type = tv.RandomHorizontalFlip if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        flip = torch.rand(1) < self.transform.p
        if flip:
            matrix = self.translate(float(dst_size[1]), 0.0) @ self.hflip() @ matrix
        return matrix, dst_size, ("RandomHorizontalFlip", flip)


class RandomVerticalFlipMapper(TransformMapper[Any]):
    source_type = tv.RandomVerticalFlip if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        flip = torch.rand(1) < self.transform.p
        if flip:
            matrix = self.translate(0.0, float(dst_size[0])) @ self.vflip() @ matrix
        return matrix, dst_size, ("RandomVerticalFlip", flip)


class RandomRotationMapper(TransformMapper[Any]):
    source_type = tv.RandomRotation if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        t = self.transform
        angle = t.get_params(t.degrees)
        height, width = (int(v) for v in dst_size)
        cx, cy = (width / 2.0, height / 2.0) if t.center is None else map(float, t.center)
        rotation = self.rotate(math.radians(angle))
        out_h, out_w = height, width
        out_cx, out_cy = cx, cy
        if t.expand:
            # the bounding box of the rotated image, shifted as PIL shifts it
            corners = np.array([[0, 0, 1], [width, 0, 1], [width, height, 1], [0, height, 1]])
            moved = (rotation @ (corners - [cx, cy, 0]).T).T
            out_w = math.ceil(moved[:, 0].max()) - math.floor(moved[:, 0].min())
            out_h = math.ceil(moved[:, 1].max()) - math.floor(moved[:, 1].min())
            out_cx, out_cy = cx + (out_w - width) / 2.0, cy + (out_h - height) / 2.0
        matrix = self.translate(out_cx, out_cy) @ rotation @ self.translate(-cx, -cy) @ matrix
        return matrix, np.array([out_h, out_w]), ("RandomRotation", angle)

    def fill(self):
        return self.transform.fill

    def interpolation(self):
        return self.transform.interpolation


def _homography(source: Sequence[Sequence[float]], target: Sequence[Sequence[float]]) -> np.ndarray:
    """The 3x3 perspective matrix that maps the four ``source`` points onto ``target``."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(source, target):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs += [u, v]
    coefficients = np.linalg.solve(np.array(rows, dtype=np.float64), np.array(rhs, np.float64))
    return np.append(coefficients, 1.0).reshape(3, 3)


class RandomPerspectiveMapper(TransformMapper[Any]):
    source_type = tv.RandomPerspective if tv is not None else None

    def apply_transform(self, matrix, dst_size):
        t = self.transform
        if not torch.rand(1) < t.p:
            return matrix, dst_size, ("RandomPerspective", None)
        height, width = (int(v) for v in dst_size)
        start, end = t.get_params(width, height, t.distortion_scale)
        matrix = _homography(start, end) @ matrix
        return matrix, dst_size, ("RandomPerspective", (start, end))

    def fill(self):
        return self.transform.fill

    def interpolation(self):
        return self.transform.interpolation


_MAPPERS: tuple[type[TransformMapper], ...] = (
    ResizeMapper,
    RandomResizedCropMapper,
    CenterCropMapper,
    RandomCropMapper,
    RandomHorizontalFlipMapper,
    RandomVerticalFlipMapper,
    RandomRotationMapper,
    RandomPerspectiveMapper,
)


def _agreed(values: list[tuple[Any, TransformMapper]], what: str, default: Any) -> Any:
    """The one value every step that has one agrees on (ValueError naming the two that differ)."""
    chosen: tuple[Any, TransformMapper] | None = None
    for value, mapper in values:
        if value is None:
            continue
        if chosen is not None and value != chosen[0]:
            raise ValueError(
                f"{what} are not equal: {chosen[0]} ({type(chosen[1]).__name__}) != {value} "
                f"({type(mapper).__name__}); all merged transforms must use the same {what.lower()}"
            )
        chosen = chosen or (value, mapper)
    return default if chosen is None else chosen[0]


class MergeTransform(torch.nn.Module):
    """Applies ``transforms`` (torchvision geometric transforms and ``CustomTransform``s) as one
    affine or perspective warp of a PIL image or an image tensor (``[..., C, H, W]``)."""

    def __init__(self, transforms: list[torch.nn.Module]) -> None:
        super().__init__()
        _require_torchvision()
        self.transforms = [self._transform_to_mapper(t) for t in transforms]
        self.interpolation = _agreed(
            [(m.interpolation(), m) for m in self.transforms],
            "Interpolation modes",
            tv.InterpolationMode.BILINEAR,
        )
        self.fill_value = _agreed([(m.fill(), m) for m in self.transforms], "Fill values", 0)

    def _transform_to_mapper(self, transform: Any) -> TransformMapper:
        if isinstance(transform, TransformMapper):
            return transform
        for mapper in _MAPPERS:
            if type(transform) is mapper.source_type:
                return mapper(transform)
        raise ValueError(
            f"{type(transform).__name__} cannot be merged: supported are "
            f"{', '.join(m.source_type.__name__ for m in _MAPPERS)} and CustomTransform subclasses"
        )

    def forward(self, x: Any) -> Any:
        if isinstance(x, PIL.Image.Image):
            height, width = x.height, x.width
        else:
            height, width = int(x.shape[-2]), int(x.shape[-1])
        matrix, size = np.eye(3), np.array([height, width])
        for mapper in self.transforms:
            matrix, size, _ = mapper.apply_transform(matrix, size)
        out_h, out_w = int(size[0]), int(size[1])
        inverse = np.linalg.inv(matrix)
        inverse = inverse / inverse[2, 2]
        if isinstance(x, PIL.Image.Image):
            return self._warp_pil(x, inverse, out_w, out_h)
        return self._warp_tensor(x, inverse, out_w, out_h)

    def _warp_pil(self, image: PIL.Image.Image, inverse: np.ndarray, width: int, height: int):
        affine = np.allclose(inverse[2], [0.0, 0.0, 1.0])
        method = PIL.Image.Transform.AFFINE if affine else PIL.Image.Transform.PERSPECTIVE
        data = inverse.flatten()[:6] if affine else inverse.flatten()[:8]
        fill = self.fill_value
        bands = len(image.getbands())
        if isinstance(fill, numbers.Number) and bands > 1:
            fill = tuple([fill] * bands)
        elif isinstance(fill, (list, tuple)):
            fill = tuple(fill) if len(fill) > 1 else fill[0]
        return image.transform(
            (width, height),
            method,
            data=tuple(float(v) for v in data),
            resample=tv_functional.pil_modes_mapping[self.interpolation],
            fillcolor=fill,
        )

    def _warp_tensor(self, image: torch.Tensor, inverse: np.ndarray, width: int, height: int):
        shape, dtype = image.shape, image.dtype
        batch = image.reshape(-1, *shape[-3:]) if image.ndim != 3 else image[None]
        work = batch if batch.is_floating_point() else batch.to(torch.float32)
        # output pixel centres -> source coordinates -> grid_sample's [-1, 1] (align_corners=False)
        ys, xs = torch.meshgrid(
            torch.arange(height, dtype=torch.float64) + 0.5,
            torch.arange(width, dtype=torch.float64) + 0.5,
            indexing="ij",
        )
        points = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1) @ torch.from_numpy(inverse).T
        src = points[..., :2] / points[..., 2:]
        grid = torch.stack([2 * src[..., 0] / shape[-1] - 1, 2 * src[..., 1] / shape[-2] - 1], -1)
        grid = grid.to(work.dtype)[None].expand(work.shape[0], -1, -1, -1)
        # a ones channel tells how much of each output pixel lies inside the source
        with_mask = torch.cat([work, torch.ones_like(work[:, :1])], dim=1)
        mode = (
            self.interpolation.value if self.interpolation.value != "nearest-exact" else "nearest"
        )
        sampled = torch.nn.functional.grid_sample(
            with_mask, grid, mode=mode, padding_mode="zeros", align_corners=False
        )
        out, mask = sampled[:, :-1], sampled[:, -1:]
        fill = torch.as_tensor(self.fill_value, dtype=out.dtype).reshape(1, -1, 1, 1)
        if mode == "nearest":
            mask = mask > 0.5
            out = torch.where(mask, out, fill)
        else:
            out = out * mask + (1 - mask) * fill
        if not batch.is_floating_point():
            out = out.round().clamp(torch.iinfo(dtype).min, torch.iinfo(dtype).max).to(dtype)
        return out.reshape(*shape[:-2], height, width)
