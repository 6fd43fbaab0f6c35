"""How a batch's text crosses from a loader worker to the main process cheaply.

torch's DataLoader pickles every batch in the worker and unpickles it in the main process. Pickle
writes a ``str`` as UTF-8: for text that is not pure ASCII (accents are enough) the worker then
encodes every string to UTF-8 (and CPython keeps that copy with the string), and the main process
decodes it again, both a character at a time. Most such text is stored by CPython one byte per
character (Latin-1), and for that storage ``encode("latin-1")`` and ``decode("latin-1")`` are plain
copies. On the text workload this took the workers' feeder threads from ~190 to ~145 us per batch
(measured in ``docs/benchmarks.md``, "Text with workers").

:func:`pack_strings` marks the lists of strings of a batch (a dataclass's fields, or a dict's
values) in the worker right before it is sent; what the main process unpickles is the same plain
``list`` of the same ``str`` values. Only the worker's copy of the batch is changed, and nothing
reads it after.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

__all__ = ["pack_strings"]


class _StringsInTransit(list):
    """A list of str that pickles its non-ASCII, one-byte-per-character strings as Latin-1 bytes."""

    def __reduce__(self) -> tuple:
        try:  # the common case: every string fits Latin-1 (ASCII ones too: also a plain copy)
            return _latin1_strings, (list(map(_encode_latin1, self, _LATIN1)),)
        except UnicodeEncodeError:
            return _strings, (list(map(_as_latin1, self)),)


def _as_latin1(text: str) -> str | bytes:
    """``text`` itself when pickle writes it cheaply (ASCII: its storage is its UTF-8), else its
    Latin-1 bytes, else (a character above U+00FF) itself."""
    if text.isascii():
        return text
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text


_encode_latin1 = str.encode
_LATIN1 = itertools.repeat("latin-1")


def _latin1_strings(items: list[bytes]) -> list[str]:
    return list(map(str, items, _LATIN1))  # a C loop: no Python frame per string


def _strings(items: list[str | bytes]) -> list[str]:
    return [item.decode("latin-1") if type(item) is bytes else item for item in items]


def pack_strings(value: Any) -> None:
    """In place: every field of ``value`` (a dataclass sample or batch, or a dict) that is a list
    of strings, some not ASCII, travels as :class:`_StringsInTransit`. Other values are left
    alone."""
    if type(value) is dict:
        for name, column in value.items():
            if type(column) is list and _worth_packing(column):
                value[name] = _StringsInTransit(column)
        return
    for name in _field_names(type(value)):
        column = getattr(value, name, None)
        if type(column) is list and _worth_packing(column):
            try:
                setattr(value, name, _StringsInTransit(column))
            except (AttributeError, TypeError):
                return  # a frozen dataclass: its strings travel as they are


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The dataclass fields of ``cls`` (none for other types), looked up once per type."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = (
            tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()
        )
        _FIELD_NAMES[cls] = names
    return names


def _worth_packing(column: list[Any]) -> bool:
    """A list of str only, with at least one that is not ASCII."""
    some_wide = False
    for item in column:
        if type(item) is not str:
            return False
        if not some_wide and not item.isascii():
            some_wide = True
    return some_wide
