"""The remote-store contract: what :mod:`energon.epath` needs from one object-storage scheme.

Each scheme is one module (:mod:`energon.remote.s3`, :mod:`energon.remote.msc`) whose functions
implement :class:`RemoteStore`; :func:`energon.epath._store` picks the module by the URL's scheme
(the only place that does). URL helpers live here so that store modules never import ``epath``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable


@runtime_checkable
class RemoteStore(Protocol):
    """Object operations on full URLs (``scheme://root/key``), with retries and counted requests.

    A missing object raises :class:`energon.remote.RemoteNotFoundError`; other failures raise
    :class:`energon.remote.RemoteError` after the retries are spent. Writes are atomic: a reader
    sees the old object or the complete new one.
    """

    def head(self, url: str) -> tuple[int, str]:
        """(size, etag) of an object."""
        ...

    def read_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of an object."""
        ...

    def read_bytes(self, url: str) -> bytes: ...

    def download(self, url: str, target: str) -> int:
        """Stream an object into the local file ``target``; returns its size."""
        ...

    def write_bytes(self, url: str, data: bytes) -> None: ...

    def upload(self, local: str, url: str) -> None:
        """Stream the local file ``local`` to ``url``."""
        ...

    def delete(self, url: str) -> None: ...

    def list_keys(self, url_prefix: str) -> Iterator[str]:
        """Full URLs of the objects whose URL starts with ``url_prefix``."""
        ...

    def is_dir(self, url: str) -> bool:
        """Any object lies under ``url/``."""
        ...


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; ``msc://profile/a/b`` -> ``("profile", "a/b")``."""
    scheme, _, rest = url.partition("://")
    root, _, key = rest.partition("/")
    if not root:
        what = "profile" if scheme == "msc" else "bucket"
        raise ValueError(f"{url}: a {scheme} URL needs a {what} ({scheme}://{what}/key)")
    return root, key
