"""The ``__padding__`` flag of yielded items: which entries are filler.

Validation keeps ranks even by filling positions that have no item (a stream with fewer samples
than the common batch count, samples that were skipped, a rank whose data-dependent pass ended
before the others') with *filler* items: flagged copies of a real item. Every item a loader yields
says which of its entries are filler so that metrics can mask them out:

- an item whose ``__key__`` is a list or tuple (a batch) carries a list of bools parallel to it;
- any other item (an unbatched sample) carries one bool.

Real items are all ``False``, fillers all ``True``. Samples and batches (``Sample``/``Batch``
declare the attribute; it is not a dataclass field, so their fields stay Megatron-Energon's), other
dataclass instances with a ``__dict__`` and objects whose class declares ``__padding__`` get the
attribute on every item. Dicts are the task encoder's own data, shaped as code written for
Megatron-Energon expects: a real dict is left as it is (no entry means real: :func:`is_padding`
answers all ``False``), a filler dict gets a ``"__padding__"`` entry. Other types (tensors, tuples)
carry no flag: a real item of such a type is yielded as it is, a filler cannot be made of it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from energon.errors import PaddingError

FIELD = "__padding__"


def _key_of(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("__key__")
    return getattr(value, "__key__", None)


def flags_for(value: Any, padding: bool) -> bool | list[bool]:
    """``padding`` for every entry of ``value``: a list parallel to a list ``__key__``, else a bool."""
    key = _key_of(value)
    if isinstance(key, list | tuple):
        return [padding] * len(key)
    return padding


def _can_carry(value: Any) -> bool:
    if isinstance(value, type):
        return False
    if dataclasses.is_dataclass(value):
        return hasattr(value, FIELD) or hasattr(value, "__dict__")
    return hasattr(type(value), FIELD)


def mark(value: Any, padding: bool) -> bool:
    """Set ``value``'s ``__padding__`` flags; False when its type cannot carry them."""
    if isinstance(value, dict):
        if padding or FIELD in value:
            value[FIELD] = flags_for(value, padding)
        return True
    if not _can_carry(value):
        return False
    try:
        object.__setattr__(value, FIELD, flags_for(value, padding))
    except (AttributeError, TypeError):
        return False
    return True


def filler_from(template: Any) -> Any:
    """A filler item: a shallow copy of ``template`` with every entry flagged as padding."""
    filler = copy.copy(template)
    if not mark(filler, True):
        raise PaddingError(
            f"validation needs a filler item to keep ranks even, but items of type "
            f"{type(template).__name__} cannot carry the {FIELD} flag that marks it: return "
            "dicts, Sample or Batch instances (or objects with attributes) from the task "
            "encoder, or pass even_ranks=False to get_val_dataset (uneven ranks, no fillers)"
        )
    return filler


def is_padding(value: Any) -> bool | list[bool] | None:
    """The ``__padding__`` flags of a yielded item (None when its type cannot carry them)."""
    if isinstance(value, dict):
        return value[FIELD] if FIELD in value else flags_for(value, False)
    return getattr(value, FIELD, None)


class PaddingFlag:
    """Mixin of ``Sample`` and ``Batch``: ``__padding__`` kept in a slot, outside the dataclass
    fields (the fields stay Megatron-Energon's, so code that lists them sees the same ones).
    Unset, it reads as all ``False`` (one bool for a sample, one per key for a batch)."""

    __slots__ = ("_padding_flags",)

    @property
    def __padding__(self) -> bool | list[bool]:
        try:
            return self._padding_flags
        except AttributeError:
            return flags_for(self, False)

    @__padding__.setter
    def __padding__(self, flags: bool | list[bool]) -> None:
        object.__setattr__(self, "_padding_flags", flags)


def copy_flag(source: Any, target: Any) -> None:
    """Carry the flag ``source`` was given over to ``target`` derived from it (``derive_from``)."""
    flags = getattr(source, "_padding_flags", None)
    if flags is not None and isinstance(target, PaddingFlag):
        target.__padding__ = flags
