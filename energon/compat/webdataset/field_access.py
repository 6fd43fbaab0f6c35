"""``megatron.energon.flavors.webdataset.field_access``: field-map access strings
(``"txt,json[caption]"``: the first alternative that exists; ``[...]`` indexes dicts and lists)."""

from __future__ import annotations

import re
from typing import Any

from energon.errors import FieldAccessError, SampleException
from energon.sample_text import format_sample_compact

__all__ = [
    "FieldAccessError",
    "SampleException",
    "field_access",
    "format_sample_compact",
    "split_field_access",
]

_ALTERNATIVE = re.compile(r"^([^\[\],]+)((?:\[[^\[\]]*\])*)$")


def split_field_access(field_desc: str) -> list[list[str]]:
    """``"txt,json[a][0]"`` -> ``[["txt"], ["json", "a", "0"]]`` (one list per alternative)."""
    result = []
    for option in field_desc.split(","):
        option = option.strip()
        match = _ALTERNATIVE.match(option)
        if match is None:
            raise ValueError(f"Invalid field access {option!r} in {field_desc!r}")
        result.append([match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))])
    return result


def _access(value: Any, path: list[str]) -> Any:
    for name in path:
        value = value[int(name)] if isinstance(value, (list, tuple)) else value[name]
    return value


def field_access(value: Any, field: list[list[str]]) -> Any:
    """The first alternative of ``field`` (from :func:`split_field_access`) that exists in
    ``value``; :class:`FieldAccessError` when none does."""
    for path in field:
        try:
            return _access(value, path)
        except (KeyError, IndexError, TypeError):
            continue
    raise FieldAccessError(
        f"Cannot access {'.'.join(field[-1])!r} in {format_sample_compact(value)}"
    )
