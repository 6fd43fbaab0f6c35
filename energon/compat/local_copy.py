"""``megatron.energon.local_copy``: a local file for a remote one (e.g. an index that SQLite opens),
kept in energon's remote cache and fetched again when the remote object changed."""

from __future__ import annotations

import os

from energon import epath
from energon.compat.epathlib import EPath

__all__ = ["EPath", "LOCAL_COPY_TMP_DIR", "ensure_local_copy"]

LOCAL_COPY_TMP_DIR = os.environ.get("ENERGON_CACHE_DIR", "/tmp/energon_local_copy")


def ensure_local_copy(path: EPath) -> EPath:
    """``path`` itself when it is local, else the path of an up-to-date local copy."""
    path = EPath(path)
    if path.is_local():
        return path
    return EPath(epath.local_copy(str(path)))
