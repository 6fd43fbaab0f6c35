"""Recycled memory for large batch tensors (the padded float image batches).

Allocating a fresh 100+ MB batch every step costs more than decoding the images in it: every page
is faulted in and zeroed by the kernel, in the worker and again in the main process. The arena keeps a
few memory blocks per worker and reuses them:

Blocks are files in ``/dev/shm`` mapped once by the worker and once by the main process. A batch
tensor placed in a block travels as a tiny :class:`ArenaRef` (block, offset, shape, stride, dtype)
instead of through torch's per-tensor shared memory, and the main process hands out a view of its own
mapping of the same block. (Without workers, batches come from :mod:`energon.memory.buffer_pool`.)

A block is free again when the last tensor viewing it is garbage-collected (a finalizer on the numpy
view under the handed-out tensor), so batches the user keeps are never overwritten.

**Memory budget.** Without a bound, every batch in flight is a block: with torch's default
``prefetch_factor=2`` each worker would keep two finished batches queued, one being made and one the
training loop holds, 6 x 150 MB for two workers on a default image batch. The arena instead gives
each worker at most ``ARENA_BYTES_PER_WORKER`` (``ENERGON_ARENA_MIB_PER_WORKER``) of written
block memory (never fewer than the loop needs to run: the blocks of one earlier batch per
worker, of two with a single worker, where the loop holds batch n while batch n + 1 is made; the
batch being made may take a block for each of its large tensors): a worker whose blocks are all in use waits before writing its next batch until the main
process frees one. Decoding runs ahead of that point, only the write into the batch waits, so the
workers stay busy as long as making a batch's samples takes longer than writing the batch. A worker
never waits while the main process is waiting for that very worker's batch (the loop keeps
batches, or the workers' order changed): it then takes another block rather than stall the loader.
When even that is impossible the arena falls back to ordinary allocation: correct, just not faster.
"""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing
import multiprocessing.util
import os
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from energon.memory.buffer_pool import numpy_dtype

SHM_DIR = "/dev/shm"
BLOCKS_PER_WORKER = 8
MIN_BYTES = 1 << 20  # small tensors are not worth pooling
# a worker's blocks, beyond the minimum the loop needs (ENERGON_ARENA_MIB_PER_WORKER overrides)
ARENA_BYTES_PER_WORKER = 256 << 20
WAIT_SECONDS = 0.0005  # how often a worker over its budget looks for a freed block
NO_WORKER = -1  # the main process is not waiting for a batch
ANY_WORKER = -2  # the main process waits, for a worker it cannot name


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
    __slots__ = ("index", "name", "capacity", "used", "group", "array", "exported", "generation")

    def __init__(self, index: int, name: str, capacity: int, array: np.ndarray) -> None:
        self.index = index
        self.name = name
        self.capacity = capacity
        self.used = 0  # the most bytes a batch wrote: the block's resident memory
        self.group = -1  # the group whose batch was last written into it
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
        self.owner = os.getpid()  # the main process, which reads the batches
        self.prefix = f"energon-{self.owner}-{uuid.uuid4().hex[:8]}"
        # 1 = in use; written by whichever process holds the last reference.
        self.flags = multiprocessing.RawArray("b", max(1, num_workers) * BLOCKS_PER_WORKER)
        # the worker whose batch the main process is blocked on (NO_WORKER, ANY_WORKER)
        self.awaited = multiprocessing.RawValue("i", NO_WORKER)
        # ... and which of that worker's groups (counted from 0)
        self.awaited_group = multiprocessing.RawValue("q", 0)
        self.group = 0  # in a worker: the group it is making
        self.closing = multiprocessing.RawValue("b", 0)  # 1 = the workers are being shut down
        # the earlier batches a worker may always keep in blocks: what the loop holds while it
        # waits for the batch being made (see the module docstring)
        self.min_batches = 2 if num_workers <= 1 else 1
        self.budget_bytes = _budget_bytes()
        # 1 = the worker made its last batch (torch then skips it: nobody may wait for it)
        self.ended = multiprocessing.RawArray("b", max(1, num_workers))
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
        if os.getpid() != self.owner:
            # the main process removes the files when it ends; if it was killed, this worker does
            multiprocessing.util.Finalize(None, self._remove_files_if_orphaned, exitpriority=0)

    def _owner_gone(self) -> bool:
        """In a worker: whether the main process has died (the worker was re-parented)."""
        return os.getpid() != self.owner and os.getppid() != self.owner

    def _remove_files_if_orphaned(self) -> None:
        if self._owner_gone():
            for block in self._blocks.values():
                _unlink_quietly(block.name)

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
        """A block within the worker's budget, waiting for the main process to free one while
        the main process is not waiting for this worker; past the budget when it is."""
        while True:
            if self.closing.value or self._owner_gone():
                # the batch will never be read: do not hold up the shutdown, and do not wait
                # forever for a main process that was killed (the worker then ends: its pipes are gone)
                return None
            block = self._claim_block(nbytes, within_budget=True)
            if block is not None:
                return block
            if self._main_waits_for_me():
                return self._claim_block(nbytes, within_budget=False)
            time.sleep(WAIT_SECONDS)

    def _main_waits_for_me(self) -> bool:
        """Whether the main process waits for the group this worker is making (not for one it
        already sent: that is on its way)."""
        awaited = self.awaited.value
        if awaited == NO_WORKER:
            return False
        if awaited == self.worker:
            return self.awaited_group.value == self.group
        return awaited == ANY_WORKER or bool(self.ended[awaited])

    def count_groups(self, groups: Iterator[Any]) -> Iterator[Any]:
        """The worker's groups, counted (see _main_waits_for_me); then marks the worker ended
        (torch moves past an ended worker inside one wait of the main process, which then waits
        for a worker it did not name)."""
        for group in groups:
            yield group
            self.group += 1
        self.ended[self.worker] = 1

    def main_waits_for(self, worker: int, group: int = 0) -> None:
        """Main process: say whose group it is blocked on (NO_WORKER when it is not)."""
        self.awaited_group.value = group  # first: a worker reads the worker first
        self.awaited.value = worker

    def _claim_block(self, nbytes: int, within_budget: bool) -> _Block | None:
        """A free block that fits (the one with the most memory already resident); else a new
        one that replaces a free block too small (so the worker's blocks stay as many as its
        batches in flight), else one in an empty slot; None when there is no slot, or when the
        new block would take the resident memory of the worker's blocks past its budget
        (``within_budget``) while it has its minimum in use. A block's capacity beyond what
        batches wrote is never touched, so it costs no memory; blocks are made roomy (see
        _capacity) so that a larger batch seldom needs a new one."""
        base = self.worker * BLOCKS_PER_WORKER
        blocks = [self._blocks.get(i) for i in range(base, base + BLOCKS_PER_WORKER)]
        # one reading of the flags: the main process frees blocks meanwhile
        busy = {b.index for b in blocks if b is not None and self.flags[b.index]}
        free = [b for b in blocks if b is not None and b.index not in busy]
        fitting = [b for b in free if b.capacity >= nbytes]
        if fitting:
            return self._mark_used(max(fitting, key=lambda b: b.used), nbytes)
        replaced = free[0] if free else None  # every free block is too small
        if replaced is not None:
            slot = replaced.index
        else:
            slot = next((base + i for i, b in enumerate(blocks) if b is None), None)
            if slot is None:
                return None
        # earlier batches still in blocks (a batch with several large tensors, two images say,
        # takes a block for each: the batch being made is never held back)
        earlier = {b.group for b in blocks if b is not None and b.index in busy}
        earlier.discard(self.group)
        kept = sum(b.used for b in blocks if b is not None and b is not replaced)
        if len(earlier) >= self.min_batches and kept + nbytes > self.budget_bytes:
            return self._exceed_budget(slot, nbytes) if not within_budget else None
        return self._mark_used(self._new_block(slot, nbytes), nbytes)

    def _exceed_budget(self, slot: int, nbytes: int) -> _Block:
        """The one place a worker takes a block past its budget: the main process waits for
        this very batch, so holding it back would stall the loader (a claim that finds a freed
        block meanwhile never gets here)."""
        return self._mark_used(self._new_block(slot, nbytes), nbytes)

    def _mark_used(self, block: _Block, nbytes: int) -> _Block:
        self.flags[block.index] = 1
        block.used = max(block.used, nbytes)
        block.group = self.group
        block.exported = False
        block.generation += 1
        return block

    def _new_block(self, index: int, nbytes: int) -> _Block:
        old = self._blocks.pop(index, None)
        if old is not None:
            self._forget_address(old)
        capacity = _capacity(nbytes, self.budget_bytes)
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

    def release_workers(self) -> None:
        """Main process, before it shuts the workers down: a worker waiting for a block stops
        waiting (so it can see the shutdown at once instead of being killed after torch's join
        timeout)."""
        self.closing.value = 1

    def close(self) -> None:
        """Remove this arena's files (mappings stay valid while tensors use them)."""
        self._remove_files()


def _capacity(nbytes: int, budget_bytes: int) -> int:
    """A new block's size: room for larger batches (twice this one, at least the budget), so
    that a batch of a larger shape seldom replaces it. Only written pages take memory; a
    replacement would hold both blocks until the main process lets go of the old one."""
    return max(2 * nbytes, budget_bytes)


def _budget_bytes() -> int:
    mib = os.environ.get("ENERGON_ARENA_MIB_PER_WORKER")
    if not mib:
        return ARENA_BYTES_PER_WORKER
    try:
        value = int(mib)
    except ValueError:
        raise ValueError(
            f"ENERGON_ARENA_MIB_PER_WORKER must be a number of MiB, got {mib!r}"
        ) from None
    if value < 0:
        raise ValueError(f"ENERGON_ARENA_MIB_PER_WORKER must be >= 0, got {value}")
    return value << 20


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
