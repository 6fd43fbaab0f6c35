"""Even validation passes: filler items, and the per-step agreement of ranks whose pass length
depends on the data.

Two cases (docs/ordering.md, "Evenness"):

- **Planned** passes (the item count follows from the sample counts): every rank has the same number
  of positions, known before the first step. A position whose stream has no item left (fewer samples
  than batches, skipped samples) arrives as a hole and becomes a filler. No collective is needed.
- **Data-dependent** passes (packing, grouping, generator hooks): nobody knows the length in
  advance. When ``torch.distributed`` is initialised, the ranks agree before every step whether any
  of them has another item (one tiny ``all_reduce`` per step, on the data-parallel group); a rank
  that ran out yields fillers until all have. Every rank calls it once per step and once at the end,
  so the collectives line up with whatever the training loop does between steps. Without
  ``torch.distributed`` there is nobody to agree with: ranks may get different counts (warned once).

A filler is a flagged copy (``__padding__`` all True) of a *template*: the first item of a logical
stream, regenerated in the loader's process, so fillers do not depend on timing or on the state.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data

from energon.errors import EmptyDatasetError
from energon.pipeline.keys import attach_restore_key, stream_key
from energon.samples import padding

if TYPE_CHECKING:
    from energon.loader.savable_dataset import SavableDataset

_warned: set[str] = set()


class Fillers:
    """Filler items for one loader pass; each template is made once per pass."""

    def __init__(self, dataset: SavableDataset) -> None:
        self.dataset = dataset
        self._templates: dict[int, Any] = {}

    def make(self, stream: int) -> Any:
        """A filler for a position of ``stream``: a flagged copy of the first item of ``stream``
        (or of the next stream that has one)."""
        template = self._templates.get(stream)
        if template is None:
            template = self._templates[stream] = self._first_item_from(stream)
        return padding.filler_from(template)

    def _first_item_from(self, stream: int) -> Any:
        num_streams = self.dataset.spec.num_streams
        for offset in range(num_streams):
            stream_id = (stream + offset) % num_streams
            try:
                value, key = self.dataset.build_stream(stream_id).next()
            except StopIteration:
                continue
            attach_restore_key(value, stream_key(stream_id, 0, key))
            return torch.utils.data.default_convert(value)
        raise EmptyDatasetError(
            "validation needs a filler item to keep ranks even, but no logical stream yields any "
            "item (every sample was skipped?)"
        )


def agreement_group(dataset: SavableDataset) -> tuple[bool, Any]:
    """(agree per step, the process group) for a pass over ``dataset``: only a data-dependent
    validation pass with several ranks agrees, and only through an initialised torch.distributed
    whose group has ``world_size`` ranks. Otherwise counts may differ between ranks (warned once)."""
    spec, wc = dataset.spec, dataset.worker_config
    if spec.training or spec.repeat or not spec.even_ranks or spec.planned_validation:
        return False, None
    if spec.balance is not None:  # every rank takes part in every balanced step: even already
        return False, None
    import torch.distributed as dist

    group = wc.data_parallel_group
    if not (dist.is_available() and dist.is_initialized()):
        _warn_once(
            "this validation pass's length depends on the data (packing, grouping or a generator "
            f"hook) and torch.distributed is not initialised: the {wc.world_size} ranks cannot "
            "agree on it, so their batch counts may differ. Every item is still delivered once."
        )
        return False, None
    if dist.get_world_size(group) != wc.world_size:
        _warn_once(
            f"WorkerConfig.world_size={wc.world_size}, but the data-parallel process group has "
            f"{dist.get_world_size(group)} ranks: validation ranks cannot agree on the pass "
            "length, so their batch counts may differ"
        )
        return False, None
    return True, group


def any_rank_has_item(has_item: bool, group: Any) -> bool:
    """One step's agreement: does any rank of ``group`` have another item?"""
    import torch.distributed as dist

    device = "cpu"
    if "nccl" in str(dist.get_backend(group)).lower():
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([1 if has_item else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=4)
