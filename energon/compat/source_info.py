"""``megatron.energon.source_info``: where a sample's data came from
(energon's :mod:`energon.samples.source_info`)."""

from __future__ import annotations

from energon.compat.epathlib import EPath
from energon.samples.source_info import SourceInfo, add_source_info, get_source_info

__all__ = ["EPath", "SourceInfo", "add_source_info", "get_source_info"]
