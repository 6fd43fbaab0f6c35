"""Collating lists of samples into batches.

``generic_batch`` is the default collation (what ``DefaultTaskEncoder.batch`` and
``Batch.from_samples`` use): tensors are stacked, padding with zeros where shapes differ,
containers are batched field by field, everything else becomes a list. The ``concat`` variants
join batches that already have a batch dimension (used when mixing batches).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from energon.decode.pending import PendingImage
from energon.decode.threads import run_on_threads
from energon.memory.batch_arena import active_arena
from energon.memory.buffer_pool import buffer_pool, numpy_dtype

__all__ = [
    "batch_list",
    "batch_pad_stack",
    "batch_stack",
    "concat_pad",
    "generic_batch",
    "generic_concat",
    "homogeneous_concat_mix",
]


def batch_stack(batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack equally shaped tensors along a new leading batch dimension."""
    return torch.stack(list(batch), dim=0)


def batch_list(batch: Sequence[Any]) -> list[Any]:
    """Keep the values as a list (for strings, variable-length objects, ...)."""
    return list(batch)


def _max_shape(tensors: Sequence[torch.Tensor], skip_dims: int = 0) -> list[int]:
    """Per-dimension maximum of the shapes (from dimension ``skip_dims`` on), checking the ranks."""
    ndim = tensors[0].dim()
    for t in tensors:
        if t.dim() != ndim:
            raise ValueError(
                f"Cannot batch tensors of different ranks: shapes {[tuple(x.shape) for x in tensors]}"
            )
    return [max(t.shape[d] for t in tensors) for d in range(skip_dims, ndim)]


_shared_in_workers = True  # see batches_in_shared_memory


def batches_in_shared_memory(enabled: bool) -> None:
    """Whether batches made in a worker process go into new shared memory (the default; see
    :func:`_new_batch_tensor`). A Ray actor turns it off: its batches leave through Ray's object
    store, which copies them anyway, and new shared memory costs a page fault per 4 KiB page
    written (it made an actor's image batches three times as costly as a local worker's)."""
    global _shared_in_workers
    _shared_in_workers = enabled


def _new_batch_tensor(like: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Uninitialised output tensor with the dtype and device of ``like``.

    Inside a DataLoader worker a CPU batch is allocated in shared memory right away (as torch's
    own ``default_collate`` does): the batch must reach the main process through shared memory
    anyway, and allocating it there saves one full copy of every batch. Elsewhere (the main
    process, a Ray actor) it comes from the buffer pool, reused memory.
    """
    shared = _shared_in_workers and torch.utils.data.get_worker_info() is not None
    if like.device.type == "cpu":
        arena = active_arena()
        if arena is not None:
            out = arena.empty(tuple(shape), like.dtype)
            if out is not None:
                return out
        elif numpy_dtype(like.dtype) is not None and not shared:
            array = buffer_pool().empty(tuple(shape), numpy_dtype(like.dtype))
            if array is not None:
                return torch.from_numpy(array)
    if like.device.type == "cpu" and shared:
        numel = math.prod(shape)
        storage = like.untyped_storage()._new_shared(numel * like.element_size())
        return torch.empty(0, dtype=like.dtype).set_(storage).view(*shape)
    return like.new_empty(tuple(shape))


def _zero_padding(out: Any, shape: Sequence[int]) -> None:
    """Zero the part of ``out`` (one item's slot, a tensor or numpy array) outside the leading
    ``shape`` corner.

    The padding is split by the first dimension in which an index lies beyond the item, so each
    padded element is written exactly once and the item's own region not at all.
    """
    inside: list[slice] = []
    for dim, size in enumerate(shape):
        if size < out.shape[dim]:
            out[(*inside, slice(size, None))] = 0
        inside.append(slice(0, size))


def batch_pad_stack(batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack tensors of equal rank but possibly different sizes into (N, *max_shape).

    Each tensor sits in the leading corner of its slot; the rest is zero. The result has the
    dtype and device of the first tensor. The batch is allocated once and every element written
    once (item data or padding zero); no per-item padded copies are made.
    """
    tensors = list(batch)
    if not tensors:
        raise ValueError("batch_pad_stack() needs at least one tensor")
    if any(isinstance(t, PendingImage) for t in tensors):
        return _pad_stack_pending(tensors)
    first = tensors[0]
    max_shape = _max_shape(tensors)
    out = _new_batch_tensor(first, (len(tensors), *max_shape))
    same_shape = all(list(t.shape) == max_shape for t in tensors)
    if first.dim() > 0 and _numpy_copyable(out, tensors):
        out_array = out.numpy()
        for slot, t in zip(out_array, tensors):
            array = t.numpy()
            slot[tuple(slice(0, size) for size in array.shape)] = array
            if not same_shape:
                _zero_padding(slot, array.shape)
        return out
    if same_shape and all(t.dtype == first.dtype and t.device == first.device for t in tensors):
        return torch.stack(tensors, dim=0, out=out)
    for slot, t in zip(out, tensors):
        slot[tuple(slice(0, size) for size in t.shape)].copy_(t)
        if not same_shape:
            _zero_padding(slot, t.shape)
    return out


def _pad_stack_pending(images: list[Any]) -> torch.Tensor:
    """``batch_pad_stack`` of images some of which are :class:`PendingImage`: each pending one is
    written from its uint8 pixels straight into its padded slot (padding zeroed in the same
    pass), the others are copied as usual."""
    dtype = images[0].dtype
    if any(t.dtype != dtype for t in images) or (
        not isinstance(images[0], PendingImage) and images[0].device.type != "cpu"
    ):
        images = [t.materialize() if isinstance(t, PendingImage) else t for t in images]
        return batch_pad_stack(images)
    max_shape = _max_shape(images)
    out = _new_batch_tensor(torch.empty(0, dtype=dtype), (len(images), *max_shape))
    threads = max(image.threads for image in images if isinstance(image, PendingImage))
    run_on_threads(threads, _write_slot, list(zip(out.numpy(), images)))
    return out


def _write_slot(slot_and_image: tuple[Any, Any]) -> None:
    """One image (pending or a tensor) into its padded slot, the padding zeroed."""
    slot, image = slot_and_image
    if isinstance(image, PendingImage):
        image.write_padded(slot)
        return
    array = image.numpy()
    slot[tuple(slice(0, size) for size in array.shape)] = array
    _zero_padding(slot, array.shape)


def _numpy_copyable(out: torch.Tensor, tensors: list[torch.Tensor]) -> bool:
    """CPU tensors of one numpy-compatible dtype are copied with numpy.

    Why: numpy copies on the calling thread, while torch's intra-op threads for these many small
    copies spin and wait, which on a loaded machine (the training process, other workers) made
    batching several times slower.
    """
    return (
        out.device.type == "cpu"
        and numpy_dtype(out.dtype) is not None
        and all(
            t.device.type == "cpu" and t.dtype == out.dtype and not t.requires_grad for t in tensors
        )
    )


def concat_pad(batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate batched tensors along dimension 0, zero-padding all other dimensions to the
    maximum (e.g. joining two (B, T) token batches with different T)."""
    tensors = list(batch)
    if not tensors:
        raise ValueError("concat_pad() needs at least one tensor")
    first = tensors[0]
    if first.dim() == 0:
        raise ValueError("concat_pad() needs tensors with a batch dimension, got a scalar")
    inner = _max_shape(tensors, skip_dims=1)
    total = sum(t.shape[0] for t in tensors)
    if all(list(t.shape[1:]) == inner for t in tensors):
        return torch.cat([t.to(dtype=first.dtype, device=first.device) for t in tensors], dim=0)
    out = first.new_zeros((total, *inner))
    start = 0
    for t in tensors:
        rows = slice(start, start + t.shape[0])
        out[(rows, *(slice(0, size) for size in t.shape[1:]))].copy_(t)
        start += t.shape[0]
    return out


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _collate_by_structure(
    batch: Sequence[Any], recurse: Callable[[list[Any]], Any], leaf: Callable[[list[Any]], Any]
) -> Any:
    """Shared walk of ``generic_batch`` and ``generic_concat``: rebuild the first item's structure
    (dict, dataclass, namedtuple) with ``recurse`` applied to each column of values."""
    first = batch[0]
    if isinstance(first, Mapping):
        return {key: recurse([item[key] for item in batch]) for key in first}
    if _is_dataclass_instance(first):
        names = [f.name for f in dataclasses.fields(first) if f.init]
        return type(first)(**{n: recurse([getattr(item, n) for item in batch]) for n in names})
    if _is_namedtuple(first):
        return type(first)(*(recurse([item[i] for item in batch]) for i in range(len(first))))
    return leaf(list(batch))


def generic_batch(batch: Sequence[Any]) -> Any:
    """Collate a list of samples by the type of the first one.

    Tensor -> ``batch_pad_stack``; dict -> dict of batched values (keys of the first); dataclass
    with ``from_samples`` (a ``Batch``) -> ``from_samples(batch)``; other dataclass / namedtuple ->
    same type with each field batched; anything else -> list.
    """
    if not batch:
        return []
    first = batch[0]
    if isinstance(first, (torch.Tensor, PendingImage)):
        return batch_pad_stack(batch)
    if _is_dataclass_instance(first) and hasattr(first, "from_samples"):
        return type(first).from_samples(list(batch))
    return _collate_by_structure(batch, generic_batch, batch_list)


def generic_concat(batch: Sequence[Any]) -> Any:
    """Join already-batched values: tensors with ``concat_pad``, dicts, dataclasses and
    namedtuples field by field, anything else (lists and tuples included) as the list of the
    batches' values, as Megatron-Energon joins them (a list column becomes a list of lists)."""
    if not batch:
        return []
    if isinstance(batch[0], torch.Tensor):
        return concat_pad(batch)
    return _collate_by_structure(batch, generic_concat, list)


def homogeneous_concat_mix(samples: Sequence[Any]) -> Any:
    """``generic_concat`` for batches that must all be of the same type (mixing batches of
    different datasets that share one batch type)."""
    if not samples:
        raise ValueError("homogeneous_concat_mix() needs at least one batch")
    kinds = {type(s) for s in samples}
    if len(kinds) != 1:
        raise TypeError(
            "homogeneous_concat_mix() needs batches of one type, got "
            + ", ".join(sorted(k.__name__ for k in kinds))
        )
    return generic_concat(samples)
