"""Megatron-Energon compatible wrappers over a :class:`SavableDataset` that change how long a pass
is: ``RepeatDataset`` and ``LimitDataset``.

Both return a new :class:`SavableDataset` whose plan says it: ``repeat`` (the data starts over when
it runs out) and ``limit`` (a pass ends after that many batches; ``limit_resets``: the next pass
starts from the beginning again, or continues where this one stopped).
"""

from __future__ import annotations

import dataclasses

from energon.loader.savable_dataset import SavableDataset
from energon.worker import WorkerConfig


def _check_worker_config(dataset: SavableDataset, worker_config: WorkerConfig) -> None:
    if not isinstance(dataset, SavableDataset):
        raise TypeError("wrap a dataset from get_train_dataset / get_val_dataset")
    if worker_config != dataset.worker_config:
        raise ValueError("worker_config differs from the wrapped dataset's worker_config")


def RepeatDataset(  # noqa: N802  (Megatron-Energon's class name)
    dataset: SavableDataset,
    *,
    repeats: int | float | None = None,
    restart: bool = True,
    worker_config: WorkerConfig,
) -> SavableDataset:
    """The dataset repeated ``repeats`` times per pass (``None``: forever; a fraction repeats the
    first part of the data), validation included.

    A pass of ``repeats=r`` yields ``int(r * len(dataset))`` batches; the next pass starts over
    (``restart=True``). ``restart=False`` (stay exhausted after the repetitions) is not supported.
    """
    _check_worker_config(dataset, worker_config)
    if not restart:
        raise ValueError("RepeatDataset(restart=False) is not supported: passes always restart")
    if repeats is not None and repeats < 0:
        raise ValueError(f"repeats must be >= 0 or None, got {repeats!r}")
    spec = dataclasses.replace(dataset.spec, repeat=True)
    if repeats is not None:
        length = int(dataset.len_rank() * repeats)
        if spec.limit is not None:
            length = min(length, spec.limit)
        spec = dataclasses.replace(spec, limit=length, limit_resets=True)
    return SavableDataset.from_spec(spec, dataset.worker_config)


def LimitDataset(  # noqa: N802  (Megatron-Energon's class name)
    dataset: SavableDataset,
    length: int,
    *,
    reset_after_epoch: bool = False,
    worker_config: WorkerConfig,
) -> SavableDataset:
    """Each pass yields at most ``length`` batches on this rank.

    ``reset_after_epoch=True``: every pass starts from the beginning (the same batches each time,
    what Megatron-LM uses for validation). ``False``: the next pass continues where this one
    stopped; a finite dataset that runs out ends the pass early and starts over in the next.
    """
    _check_worker_config(dataset, worker_config)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    spec = dataset.spec
    if spec.limit is not None:
        length = min(length, spec.limit)
    spec = dataclasses.replace(spec, limit=length, limit_resets=reset_after_epoch)
    return SavableDataset.from_spec(spec, dataset.worker_config)
