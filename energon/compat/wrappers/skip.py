"""``megatron.energon.wrappers.skip``: the old home of ``SkipSample`` (now ``megatron.energon.errors``,
the same class)."""

from __future__ import annotations

from energon.compat.deprecation import warn_deprecated
from energon.errors import SkipSample

__all__ = ["SkipSample", "warn_deprecated"]
