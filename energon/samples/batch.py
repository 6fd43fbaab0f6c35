"""``Batch``: base class for batch dataclasses built from samples."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch

from energon.decode.pending import PendingImage
from energon.samples import padding
from energon.samples.base import (
    BASE_SAMPLE_FIELDS,
    ExtendableDataclassMixin,
    FieldAccessMixin,
    PinMemoryMixin,
)
from energon.samples.collate import batch_pad_stack
from energon.samples.source_info import SourceInfo
from energon.structs import edataclass

__all__ = ["Batch"]

TBatch = TypeVar("TBatch", bound="Batch")

_MISSING = object()


@edataclass
class Batch(FieldAccessMixin, PinMemoryMixin, ExtendableDataclassMixin, padding.PaddingFlag):
    """Base of batch types. Subclass it with the batched fields, e.g. ``images: torch.Tensor``.

    Unlike the reference (S5), ``from_samples`` really pad-stacks tensor fields (as its docs
    promise); everything that is not a tensor in every sample stays a list.
    """

    #: The keys of the samples in this batch.
    __key__: list[str]
    #: Set by the batching stage to re-create this batch; per-sample restore keys before that.
    __restore_key__: Any
    #: Per-sample subflavors (None when no sample has any).
    __subflavors__: list[dict[str, Any] | None] | None = None
    #: All sources of all samples, flattened.
    __sources__: tuple[SourceInfo, ...] | None = None

    @classmethod
    def derive_from(cls: type[TBatch], base_batch: Any, **kwargs: Any) -> TBatch:
        """New ``cls`` instance that keeps the base fields of ``base_batch`` (kwargs win)."""
        values = {name: getattr(base_batch, name, None) for name in BASE_SAMPLE_FIELDS}
        values.update(kwargs)
        derived = cls(**values)
        padding.copy_flag(base_batch, derived)
        return derived

    @classmethod
    def from_samples(cls: type[TBatch], samples: Sequence[Any], **kwargs: Any) -> TBatch:
        """Build a batch whose field ``f`` collects ``sample.f`` of every sample.

        Explicit ``kwargs`` win. Tensor columns are pad-stacked into one (N, ...) tensor, other
        columns are lists; ``__sources__`` is the flattened tuple of all sources and
        ``__subflavors__`` the per-sample list (None if no sample has subflavors). Samples may be
        dataclass instances or dicts. A batch field with a default may be missing in the samples.
        """
        samples = list(samples)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if not field.init or field.name in kwargs:
                continue
            column = [_sample_value(s, field.name) for s in samples]
            if any(v is _MISSING for v in column):
                if _has_default(field):
                    continue
                raise ValueError(
                    f"{cls.__name__}.from_samples(): field {field.name!r} is missing in "
                    f"sample(s) {[_sample_key(s) for s, v in zip(samples, column) if v is _MISSING]}"
                )
            values[field.name] = _collate_column(field.name, column)
        values.update(kwargs)
        return cls(**values)


def _sample_value(sample: Any, name: str) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name, _MISSING)
    return getattr(sample, name, _MISSING)


def _sample_key(sample: Any) -> Any:
    value = _sample_value(sample, "__key__")
    return None if value is _MISSING else value


def _has_default(field: dataclasses.Field) -> bool:
    return (
        field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING  # type: ignore[misc]
    )


def _collate_column(name: str, column: list[Any]) -> Any:
    """The batching rule of one field (see ``Batch.from_samples``)."""
    if name == "__sources__":
        return tuple(info for sources in column for info in (sources or ()))
    if name == "__subflavors__":
        return column if any(column) else None
    if column and all(isinstance(v, (torch.Tensor, PendingImage)) for v in column):
        return batch_pad_stack(column)
    return column
