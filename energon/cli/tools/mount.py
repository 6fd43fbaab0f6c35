"""``megatron.energon.tools.mount``: ``energon mount`` (``command``; energon does not mount)."""

from __future__ import annotations

from errno import EBADF, ENOENT

from energon.cli.mount import command
from energon.compat.epathlib import EPath
from energon.source.file_store import WebdatasetFileStore

__all__ = ["EBADF", "ENOENT", "EPath", "WebdatasetFileStore", "command"]
