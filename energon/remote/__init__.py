"""Object-storage access (S3 API): retries, ranged reads, a local cache for index files."""

from energon.remote.retry import RemoteError, RemoteNotFoundError
from energon.remote.stats import RemoteStats, remote_stats

__all__ = ["RemoteError", "RemoteNotFoundError", "RemoteStats", "remote_stats"]
