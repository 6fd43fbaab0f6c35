"""``megatron.energon.tools.checkpoint``: ``energon checkpoint`` (``command``, with ``command_info``
and ``command_redist``) and the reference's helpers for state file names."""

from __future__ import annotations

import re
from collections.abc import Callable

from energon.cli.checkpoint import command, command_info, command_redist
from energon.compat.epathlib import EPath
from energon.compat.savable_loader import SavableDataLoaderState

__all__ = [
    "EPath",
    "SavableDataLoaderState",
    "command",
    "command_info",
    "command_redist",
    "detect_and_replicate_pattern",
    "natural_sort_key",
]


def natural_sort_key(s: str) -> list[str | int]:
    """A sort key that orders numbers by value: ``a2`` before ``a10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", s)]


def detect_and_replicate_pattern(file_list: list[str]) -> Callable[[int], str]:
    """The one numbered position in which the names differ: a function giving the ``n``-th
    name (same zero padding). Raises when the names differ otherwise, or in several numbers."""
    tokenized = [re.split(r"(\d+)", name) for name in file_list]
    if len({len(tokens) for tokens in tokenized}) != 1:
        raise Exception("Files have a different number of tokens. Invalid pattern.")
    varying = []
    for position, values in enumerate(zip(*tokenized)):
        if len(set(values)) > 1:
            if not all(v.isdigit() for v in values):
                raise Exception("Non-digit token differs among files. Invalid pattern.")
            varying.append(position)
    if len(varying) != 1:
        raise Exception(f"Expected exactly one varying number, found {len(varying)}.")
    position = varying[0]
    template = tokenized[0]
    width = len(template[position]) if template[position].startswith("0") else 0
    start = min(int(tokens[position]) for tokens in tokenized)

    def generate_filename(n: int) -> str:
        tokens = list(template)
        tokens[position] = str(start + n).zfill(width)
        return "".join(tokens)

    return generate_filename
