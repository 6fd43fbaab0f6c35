"""Reuse of large, short-lived buffers (decoded images, batches made in the main process).

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

GRANULARITY = 1 << 16  # sizes are rounded up to 64 KiB
MIN_BYTES = 1 << 18
DEFAULT_MAX_BYTES = int(os.environ.get("ENERGON_BUFFER_POOL_BYTES", 1 << 30))


class BufferPool:
    """Best-fit free list of ``bytearray`` buffers, bounded in total bytes.

    A request takes the smallest free buffer that is large enough and not more than 1.5x too large
    (image and batch sizes vary a little from one to the next); if none fits, a new buffer is made,
    evicting free buffers when the pool would exceed ``max_bytes``.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._free: list[tuple[int, int, bytearray]] = []  # sorted by size
        self._owned = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """An uninitialised C-contiguous array, or None when it is small or the pool is full."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return None
        buffer = self._take(-(-nbytes // GRANULARITY) * GRANULARITY)
        if buffer is None:
            return None
        array = np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)
        weakref.finalize(array, self._give_back, len(buffer), buffer)
        return array

    def _take(self, size: int) -> bytearray | None:
        with self._lock:
            i = bisect.bisect_left(self._free, (size, -1))
            if i < len(self._free) and self._free[i][0] * 2 <= size * 3:
                return self._free.pop(i)[2]
            while self._owned + size > self.max_bytes and self._free:
                evicted, _, _ = self._free.pop(0 if self._free[0][0] >= size else -1)
                self._owned -= evicted
            if self._owned + size > self.max_bytes:
                return None
            self._owned += size
        return bytearray(size)

    def _give_back(self, size: int, buffer: bytearray) -> None:
        with self._lock:
            bisect.insort(self._free, (size, id(buffer), buffer))

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
