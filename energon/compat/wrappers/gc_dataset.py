"""``GcDataset`` (``megatron.energon.wrappers.gc_dataset``)."""

from __future__ import annotations

import gc
from typing import Any

from energon.compat.wrappers.base import (
    BaseWrapperDataset,
    PassThrough,
    SavableDataset,
    WorkerConfig,
)
from energon.errors import GcFreezeError

__all__ = [
    "GC_DEFAULT_EVERY_N_ITER",
    "GcFreezeError",
    "gc_init_worker",
    "BaseWrapperDataset",
    "GcDataset",
    "SavableDataset",
    "WorkerConfig",
]


GC_DEFAULT_EVERY_N_ITER = 10

# CUDA tensors a forked worker inherited; kept referenced so that collecting them in the worker
# never frees the parent's memory (see gc_init_worker).
_inherited_cuda_tensors: list[Any] = []


def gc_init_worker(worker_id: int) -> None:
    """Call first in a forked worker that uses CUDA (e.g. as ``worker_init_fn``): keeps a
    reference to every CUDA tensor inherited from the parent, so that the worker's garbage
    collector never frees them."""
    import torch

    if not torch.cuda.is_available():
        return
    _inherited_cuda_tensors.extend(
        obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and obj.is_cuda
    )


class GcDataset(PassThrough):
    """Accepted for compatibility: energon's workers hold raw bytes and plain-data state, so there
    is no reference cycle build-up for a periodic ``gc.collect`` to fight; this adds no stage."""

    def __init__(
        self,
        dataset: SavableDataset,
        *,
        worker_config: WorkerConfig,
        every_n_iter: int = GC_DEFAULT_EVERY_N_ITER,
        freeze: bool = True,
    ) -> None:
        self.every_n_iter = every_n_iter
        self.freeze = freeze
        super().__init__(dataset, worker_config=worker_config)
