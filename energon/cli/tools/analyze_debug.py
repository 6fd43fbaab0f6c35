"""``megatron.energon.tools.analyze_debug``: ``energon analyze-debug`` (``command``)."""

from __future__ import annotations

from energon.cli.analyze_debug import command

__all__ = ["command"]
