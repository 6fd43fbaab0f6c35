"""``megatron.energon.worker``: ``WorkerConfig`` (energon's :mod:`energon.worker`) with the names
the reference's module also offers."""

from __future__ import annotations

from energon.compat.cache import CachePool
from energon.errors import log_exception, reraise_exception
from energon.samples.source_info import SourceInfo
from energon.worker import WorkerConfig

__all__ = ["CachePool", "SourceInfo", "WorkerConfig", "log_exception", "reraise_exception"]
