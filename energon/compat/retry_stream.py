"""``megatron.energon.retry_stream``: a read-only file over a local file or a remote object, whose
reads go through energon's remote layer (ranged reads with retries, :mod:`energon.remote`)."""

from __future__ import annotations

import io
import os

from energon import epath
from energon.compat.epathlib import EPath

__all__ = ["EPath", "RetryReadStream"]


class RetryReadStream(io.RawIOBase):
    """Seekable reads of ``path``; a failed remote read is retried from the current position."""

    def __init__(self, path: EPath) -> None:
        super().__init__()
        self.path = epath.normalize(os.fspath(path))
        self.size = epath.stat(self.path)[0]
        self.position = 0

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.position + n)
        if end <= self.position:
            return b""
        data = epath.read_range(self.path, self.position, end)
        self.position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def close(self) -> None:
        super().close()

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False
