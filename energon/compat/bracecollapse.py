"""``megatron.energon.bracecollapse``: lists of names as brace patterns (``shard_{000..099}.tar``),
the inverse of brace expansion; energon writes ``split.yaml`` with the same collapse."""

from __future__ import annotations

import re

from energon.format.split import collapse_braces

__all__ = ["collapse"]

_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def _sort_key(name: str) -> tuple[str, int, int, str]:
    """Names that differ only in their last number, by that number (equal widths together)."""
    match = _LAST_NUMBER.search(name)
    if match is None:
        return (name, 0, 0, "")
    template = name[: match.start()] + "#" + name[match.end() :]
    return (template, len(match.group(1)), int(match.group(1)), name)


def collapse(strings: list[str], keep_order: bool = False) -> list[str]:
    """Brace patterns for ``strings``. ``keep_order``: the patterns expand to the input in its
    order; otherwise as few patterns as possible (ranges first, sorted; then single names in
    their input order)."""
    if keep_order:
        return collapse_braces(list(strings))
    collapsed = collapse_braces(sorted(strings, key=_sort_key))
    patterns = sorted(p for p in collapsed if "{" in p)
    singles = set(collapsed) - set(patterns)
    return patterns + [s for s in strings if s in singles]
