"""Recycled memory for large batch tensors (the padded float image batches).

Allocating a fresh 100+ MB batch every step costs more than decoding the images in it: every page
is faulted in and zeroed by the kernel, in the worker and again in the main process. The arena keeps a
few memory blocks per worker and reuses them:

Blocks are files in ``/dev/shm`` mapped once by the worker and once by the main process. A batch
tensor placed in a block travels as a tiny :class:`ArenaRef` (block, offset, shape, stride, dtype)
instead of through torch's per-tensor shared memory, and the main process hands out a view of its own
mapping of the same block. (Without workers, batches come from :mod:`energon.memory.buffer_pool`.)

A block is free again when the last tensor viewing it is garbage-collected (a finalizer on the numpy
view under the handed-out tensor), so batches the user keeps are never overwritten. When no block is
free the arena falls back to ordinary allocation: correct, just not faster.
"""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing
import multiprocessing.util
import os
import uuid
import weakref
from typing import Any

import numpy as np
import torch

from energon.memory.buffer_pool import numpy_dtype

SHM_DIR = "/dev/shm"
BLOCKS_PER_WORKER = 8
MIN_BYTES = 1 << 20  # small tensors are not worth pooling


@dataclasses.dataclass(frozen=True)
class ArenaRef:
    """A batch tensor that lives in an arena block (what crosses the process boundary)."""

    block: int
    name: str
    capacity: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


class _Block:
    __slots__ = ("index", "name", "capacity", "array", "exported", "generation")

    def __init__(self, index: int, name: str, capacity: int, array: np.ndarray) -> None:
        self.index = index
        self.name = name
        self.capacity = capacity
        self.array = array
        self.exported = False
        self.generation = 0


def _map_file(path: str, size: int, create: bool) -> np.ndarray:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return np.frombuffer(mapping, dtype=np.uint8)


def _view(array: np.ndarray, offset: int, shape, stride, dtype: torch.dtype) -> np.ndarray:
    np_dtype = np.dtype(numpy_dtype(dtype))
    nbytes = _span(shape, stride) * np_dtype.itemsize
    flat = array[offset : offset + nbytes].view(np_dtype)
    strides = tuple(s * np_dtype.itemsize for s in stride)
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=strides)


def _span(shape, stride) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def arena_supported() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class BatchArena:
    """Per-loader arena; created in the main process before the workers are forked."""

    def __init__(self, num_workers: int) -> None:
        self.prefix = f"energon-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # 1 = in use; written by whichever process holds the last reference.
        self.flags = multiprocessing.RawArray("b", max(1, num_workers) * BLOCKS_PER_WORKER)
        self.worker = 0
        self._blocks: dict[int, _Block] = {}
        self._attached: dict[str, np.ndarray] = {}
        self._by_address: list[tuple[int, int, _Block]] = []
        self._exported = False
        # the files go when the arena is dropped or closed, and at the end of the process that
        # made it, also of a forked child (which skips atexit): multiprocessing's finalizer
        self._remove_files = multiprocessing.util.Finalize(
            self, _remove_prefixed, args=(self.prefix, os.getpid()), exitpriority=0
        )

    # -- allocation (where batches are made) ----------------------------------------------------
    def activate(self, worker: int) -> None:
        """Called in the process that makes batches (a worker, or the main process)."""
        self.worker = worker
        _active.arena = self

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised contiguous tensor in a free block, or None (then allocate normally)."""
        if numpy_dtype(dtype) is None:
            return None
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if nbytes < MIN_BYTES:
            return None
        block = self._claim(nbytes)
        if block is None:
            return None
        stride = torch.empty(0, dtype=dtype).new_empty(shape).stride() if shape else ()
        view = _view(block.array, 0, tuple(shape), stride, dtype)
        weakref.finalize(view, self._release_local, block, block.generation)
        return torch.from_numpy(view)

    def _claim(self, nbytes: int) -> _Block | None:
        """The smallest free block that fits; else a new one that replaces a free block too small
        (so the worker's blocks stay as many as its batches in flight), else one in an empty slot.
        Capacity beyond what batches wrote is never touched, so it costs no memory."""
        base = self.worker * BLOCKS_PER_WORKER
        fitting: _Block | None = None
        too_small = empty = None
        for index in range(base, base + BLOCKS_PER_WORKER):
            if self.flags[index]:
                continue
            block = self._blocks.get(index)
            if block is None:
                empty = index if empty is None else empty
            elif block.capacity >= nbytes:
                if fitting is None or block.capacity < fitting.capacity:
                    fitting = block
            elif too_small is None:
                too_small = index
        if fitting is not None:
            return self._mark_used(fitting)
        slot = too_small if too_small is not None else empty
        if slot is None:
            return None
        return self._mark_used(self._new_block(slot, nbytes))

    def _mark_used(self, block: _Block) -> _Block:
        self.flags[block.index] = 1
        block.exported = False
        block.generation += 1
        return block

    def _new_block(self, index: int, nbytes: int) -> _Block:
        old = self._blocks.pop(index, None)
        if old is not None:
            self._forget_address(old)
        capacity = max(nbytes, int(nbytes * 1.25))
        name = f"{self.prefix}-{index}-{uuid.uuid4().hex[:6]}"
        array = _map_file(os.path.join(SHM_DIR, name), capacity, create=True)
        if old is not None:
            _unlink_quietly(old.name)
        block = _Block(index, name, capacity, array)
        self._blocks[index] = block
        address = array.ctypes.data
        self._by_address.append((address, address + capacity, block))
        return block

    def _forget_address(self, block: _Block) -> None:
        self._by_address = [entry for entry in self._by_address if entry[2] is not block]

    def _release_local(self, block: _Block, generation: int) -> None:
        """The maker's last view died: free the block unless it was handed to the main process."""
        if block.generation == generation and not block.exported:
            self.flags[block.index] = 0

    # -- transfer (worker -> main) ----------------------------------------------------------------
    def export(self, value: Any) -> tuple[Any, bool]:
        """Replace tensors that live in this worker's blocks by ArenaRefs (recursively); also says
        whether anything was replaced (so the main process can skip the walk)."""
        if not self._by_address:
            return value, False
        self._exported = False
        return _transform(value, self._export_tensor), self._exported

    def _export_tensor(self, tensor: torch.Tensor) -> Any:
        address = tensor.data_ptr()
        for start, end, block in self._by_address:
            if start <= address < end:
                block.exported = True
                self._exported = True
                return ArenaRef(
                    block=block.index,
                    name=block.name,
                    capacity=block.capacity,
                    offset=address - start,
                    shape=tuple(tensor.shape),
                    stride=tuple(tensor.stride()),
                    dtype=str(tensor.dtype).removeprefix("torch."),
                )
        return tensor

    def import_(self, value: Any) -> Any:
        """Main process: turn ArenaRefs back into tensors viewing the main's mapping."""
        return _transform(value, None, self._import_ref)

    def _import_ref(self, ref: ArenaRef) -> torch.Tensor:
        array = self._attached.get(ref.name)
        if array is None:
            array = _map_file(os.path.join(SHM_DIR, ref.name), ref.capacity, create=False)
            _unlink_quietly(ref.name)  # both processes have it mapped; nothing else needs the name
            stale = f"{self.prefix}-{ref.block}-"
            self._attached = {n: a for n, a in self._attached.items() if not n.startswith(stale)}
            self._attached[ref.name] = array
        dtype = getattr(torch, ref.dtype)
        view = _view(array, ref.offset, ref.shape, ref.stride, dtype)
        weakref.finalize(view, self.flags.__setitem__, ref.block, 0)
        return torch.from_numpy(view)

    def close(self) -> None:
        """Remove this arena's files (mappings stay valid while tensors use them)."""
        self._remove_files()


def _remove_prefixed(prefix: str, owner: int) -> None:
    """Unlink the files named ``prefix...`` (only in the process ``owner``, never a worker)."""
    if os.getpid() != owner:
        return
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            _unlink_quietly(name)


def _unlink_quietly(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass


def _transform(value: Any, on_tensor, on_ref=None) -> Any:
    """Rebuild dicts, lists, tuples and dataclasses, mapping tensors (or ArenaRefs)."""
    if on_tensor is not None and isinstance(value, torch.Tensor):
        return on_tensor(value)
    if on_ref is not None and isinstance(value, ArenaRef):
        return on_ref(value)
    if isinstance(value, dict):
        changed = {k: _transform(v, on_tensor, on_ref) for k, v in value.items()}
        if all(changed[k] is value[k] for k in value):
            return value
        if type(value) is dict:
            return changed
        out = value.copy()
        out.update(changed)
        return out
    if isinstance(value, list):
        items = [_transform(v, on_tensor, on_ref) for v in value]
        return items if any(a is not b for a, b in zip(items, value)) else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        items = tuple(_transform(v, on_tensor, on_ref) for v in value)
        return items if any(a is not b for a, b in zip(items, value)) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = _transform(old, on_tensor, on_ref)
            if new is not old:
                object.__setattr__(value, field.name, new)
        return value
    return value


class _Active:
    arena: BatchArena | None = None


_active = _Active()


def active_arena() -> BatchArena | None:
    """The arena of the pipeline running in this process, if any."""
    return _active.arena
