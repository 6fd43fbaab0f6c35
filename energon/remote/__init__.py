"""Object-storage access: one module per scheme (``s3``, ``msc``) implementing the
:class:`~energon.remote.store.RemoteStore` contract, with retries, ranged reads, counters and a
local cache for index files. These modules never import :mod:`energon.epath`, which dispatches to
them."""

from energon.remote.retry import RemoteError, RemoteNotFoundError
from energon.remote.stats import RemoteStats, remote_stats

__all__ = ["RemoteError", "RemoteNotFoundError", "RemoteStats", "remote_stats"]
