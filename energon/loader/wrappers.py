"""Megatron-Energon compatible wrappers over a :class:`SavableDataset` that change its pass
length: ``RepeatDataset`` and ``LimitDataset``."""

from __future__ import annotations

import dataclasses
from typing import Any

from energon.loader.savable_dataset import SavableDataset


def RepeatDataset(
    dataset: SavableDataset, *, repeats: float | None = None, **_compat: Any
) -> SavableDataset:  # noqa: N802
    """Megatron-Energon compatible wrapper: the dataset repeats forever (validation included).

    Only ``repeats=None`` (infinite) is supported here; finite repetitions belong in a
    ``blend_epochized`` metadataset, which makes totals exact.
    """
    if repeats is not None:
        raise ValueError(
            "RepeatDataset(repeats=N): use a blend_epochized metadataset for finite repetitions"
        )
    return SavableDataset(dataclasses.replace(dataset.spec, repeat=True), dataset.worker_config)


def LimitDataset(  # noqa: N802
    dataset: SavableDataset, length: int, *, reset_after_epoch: bool = True, **_compat: Any
) -> SavableDataset:
    """Megatron-Energon compatible wrapper: each pass yields ``length`` batches per rank.

    Validation passes restart from the beginning (``reset_after_epoch=True``, what Megatron-LM
    uses); for training use ``virtual_epoch_length`` instead.
    """
    spec = dataset.spec
    if spec.training:
        spec = dataclasses.replace(spec, virtual_epoch_length=length)
    elif not reset_after_epoch:
        raise ValueError(
            "LimitDataset(reset_after_epoch=False) on validation data is not supported"
        )
    else:
        spec = dataclasses.replace(spec, limit=length)
    return SavableDataset(spec, dataset.worker_config)
