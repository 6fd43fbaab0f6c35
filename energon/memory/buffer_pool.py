"""Reuse of large, short-lived buffers (decoded images, batches made in the main process).

The pool is bounded by what the run uses: 1.5x the peak of bytes handed out at once (see
:class:`BufferPool`), capped by ``ENERGON_BUFFER_POOL_BYTES`` (1 GiB).

A 2 MB float image or a 150 MB padded batch allocated fresh every time costs a page fault per 4 KB
page, which for float image pipelines costs as much as decoding the JPEG. The pool hands out numpy
arrays over recycled memory; a buffer goes back to its size class when the handed-out array is
garbage-collected.

Contract: a pooled array must be wrapped in a torch tensor (``torch.from_numpy``) before anybody
else sees it. Torch views keep the array alive; bare numpy views of it would not (numpy points
views at the memory's owner), so the pool's arrays never leave energon unwrapped.
"""

from __future__ import annotations

import bisect
import math
import mmap
import os
import threading
import weakref

import numpy as np

# torch dtypes whose memory numpy can view directly (pooled buffers are numpy arrays)
TORCH_TO_NUMPY = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "uint8": np.uint8,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}

GRANULARITY = 1 << 16  # sizes are rounded up to 64 KiB, large ones to 1/8 of their power of two
MIN_BYTES = 1 << 18
DEFAULT_MAX_BYTES = int(os.environ.get("ENERGON_BUFFER_POOL_BYTES", 1 << 30))
#: free buffers are kept while the pool holds at most this times the peak of bytes in use
LIVE_HEADROOM = 1.5


def size_class(nbytes: int) -> int:
    """The buffer size serving a request of ``nbytes``: rounded up to 64 KiB, and above 8 MiB to
    an eighth of the power of two below it, so that batches of nearly equal shape (a padded
    image batch varies by a few percent) share buffers instead of each growing the pool."""
    step = max(GRANULARITY, 1 << max(0, nbytes.bit_length() - 4))
    return -(-nbytes // step) * step


class BufferPool:
    """Best-fit free list of anonymous memory buffers, bounded by what is really used.

    A request takes the smallest free buffer that is large enough and not more than 1.5x too large
    (image and batch sizes vary a little from one to the next); if none fits, a new buffer is made.
    The pool owns at most ``LIVE_HEADROOM`` (1.5) times the peak of bytes handed out at once
    (never more than ``max_bytes``): free buffers beyond that are dropped (smallest first) when a new
    one is made or a used one comes back, and a new buffer replaces free ones it outgrew, so its
    memory follows the batch shapes of the run rather than a fixed budget. A request that would exceed ``max_bytes`` gets None.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[tuple[int, int, mmap.mmap]] = []  # sorted by size
        self._owned = 0  # bytes of all buffers, free or handed out
        self._live = 0  # bytes handed out and not yet given back
        self._peak_live = 0
        self._lock = threading.Lock()

    @property
    def owned_bytes(self) -> int:
        return self._owned

    @property
    def live_bytes(self) -> int:
        return self._live

    @property
    def peak_live_bytes(self) -> int:
        return self._peak_live

    def limit(self) -> int:
        """Bytes the pool may hold now (free + handed out)."""
        return min(self.max_bytes, int(self._peak_live * LIVE_HEADROOM))

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """An uninitialised C-contiguous array, or None when it is small or the pool is full."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(map(int, shape)) * dtype.itemsize  # np.prod: ~5 us per image
        if nbytes < MIN_BYTES:
            return None
        buffer = self._take(size_class(nbytes))
        if buffer is None:
            return None
        array = np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
        weakref.finalize(array, self._give_back, len(buffer), buffer)
        return array

    def _take(self, size: int) -> mmap.mmap | None:
        with self._lock:
            i = bisect.bisect_left(self._free, (size, -1))
            if i < len(self._free) and self._free[i][0] * 2 <= size * 3:
                taken = self._free.pop(i)
                self._handed_out(taken[0])
                return taken[2]
            if self._live + size > self.max_bytes:
                return None
            self._drop_outgrown(size, i)
            self._handed_out(size)
            self._owned += size
            self._trim()
        # anonymous memory: pages become resident when written, so a size class larger than
        # the request costs address space, not memory. Private (mmap's default is shared): a
        # forked worker must get its own copy of the free buffers, as with any heap memory.
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def _drop_outgrown(self, size: int, end: int) -> None:
        """Free buffers a little too small for a new request (within 1.5x) were made for the same
        kind of array at a smaller shape: the new, larger buffer takes over their role."""
        start = bisect.bisect_left(self._free, (size * 2 // 3, -1))
        for dropped, _, _ in self._free[start:end]:
            self._owned -= dropped
        del self._free[start:end]

    def _handed_out(self, size: int) -> None:
        self._live += size
        self._peak_live = max(self._peak_live, self._live)

    def _trim(self) -> None:
        """Drop free buffers, smallest first, while the pool holds more than its limit."""
        limit = self.limit()
        while self._owned > limit and self._free:
            size, _, _ = self._free.pop(0)
            self._owned -= size

    def _give_back(self, size: int, buffer: mmap.mmap) -> None:
        with self._lock:
            self._live -= size
            bisect.insort(self._free, (size, id(buffer), buffer))
            self._trim()

    def clear(self) -> None:
        """Drop all free buffers (memory still in use returns to the pool, then stays)."""
        with self._lock:
            self._owned -= sum(size for size, _, _ in self._free)
            self._free = []


_pool = BufferPool()


def pooled_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A pooled array if possible, else a fresh ``np.empty`` (same semantics either way)."""
    array = _pool.empty(shape, dtype)
    return array if array is not None else np.empty(shape, dtype=dtype)


def buffer_pool() -> BufferPool:
    return _pool


def numpy_dtype(torch_dtype: object) -> type | None:
    """The numpy dtype sharing memory layout with a torch dtype, or None (e.g. bfloat16)."""
    return TORCH_TO_NUMPY.get(str(torch_dtype).removeprefix("torch."))
