"""The ``Sample`` base class, its mixins, and ``CrudeSample``.

A sample is a slotted, keyword-only dataclass. Besides the user's fields it carries five base
fields that the loader fills in: ``__key__`` (the sample's key inside its shard), ``__restore_key__``
(a plain tuple that lets the loader re-create this exact sample), ``__subflavors__`` (the
metadataset's per-dataset tags), ``__sources__`` (``SourceInfo`` tuple for error reports) and
``__padding__`` (True for a filler that keeps validation ranks even; see docs/samples.md).

There is deliberately no ``__subflavor__`` (singular) attribute: the reference removed it, and
code such as Megatron-LM checks ``hasattr(Sample, "__subflavor__")`` to decide whether to declare
it on its own subclasses, which keeps working because the attribute is absent here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import torch

from energon.samples import padding
from energon.samples.source_info import SourceInfo, unique_sources
from energon.structs import edataclass

__all__ = [
    "BASE_SAMPLE_FIELDS",
    "CrudeSample",
    "ExtendableDataclassMixin",
    "FieldAccessMixin",
    "PinMemoryMixin",
    "Sample",
    "pin_memory_recursive",
]

BASE_SAMPLE_FIELDS: tuple[str, ...] = (
    "__key__",
    "__restore_key__",
    "__subflavors__",
    "__sources__",
)

TSelf = TypeVar("TSelf")


def pin_memory_recursive(value: Any) -> Any:
    """Page-lock every tensor inside ``value`` so the host-to-device copy can run asynchronously.

    Walks dataclasses, dicts, lists, tuples and namedtuples and rebuilds them around the pinned
    tensors; objects with their own ``pin_memory()`` (nested samples) are asked to pin themselves;
    anything else is returned unchanged.
    """
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        pin = getattr(value, "pin_memory", None)
        if callable(pin):
            return pin()
        return _replace_fields(value, pin_memory_recursive)
    if isinstance(value, Mapping):
        return type(value)({k: pin_memory_recursive(v) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(pin_memory_recursive(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(pin_memory_recursive(v) for v in value)
    return value


_PLAIN_TYPES = frozenset({str, bytes, int, float, bool, type(None)})
_OWN_PINNING = ("pin_memory",)  # in _fields_to_walk: the class pins in its own way
_fields_to_walk: dict[type, tuple[str, ...]] = {}  # () for classes that are not dataclasses
# fields the loader fills with plain values (restore keys are tuples of str and int, source
# infos frozen records of them): half of a text batch's objects, never looked into
_LOADER_MADE_FIELDS = frozenset({"__restore_key__", "__sources__"})


def needs_pinning(value: Any) -> bool:
    """Whether pinning ``value`` would change anything: it holds a tensor, or an object whose own
    ``pin_memory()`` may do more than walk its fields.

    The loader asks this before it lets torch's pin-memory thread rebuild a batch: walking and
    copying the strings, keys and source infos of a text batch that holds no tensor costs that
    thread (and the main process's GIL) more than the rest of the batch's way from a worker. It is
    asked of every batch a worker makes, so the plain items of lists, tuples, dicts and dataclass
    fields (most of a text batch) are passed over without a call each.
    """
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return False
    if kind is list or kind is tuple:
        return _any_needs_pinning(value)
    if kind is dict:
        return _any_needs_pinning(value.values())
    if isinstance(value, torch.Tensor):
        return True
    names = _fields_to_walk.get(kind)
    if names is None:
        names = _fields_to_walk[kind] = _fields_to_walk_in(kind)
    if names is _OWN_PINNING:
        return True
    if names:
        return _any_needs_pinning([getattr(value, name) for name in names])
    if isinstance(value, (str, bytes, int, float, bool)):
        return False
    if isinstance(value, (list, tuple)):
        return _any_needs_pinning(value)
    if isinstance(value, Mapping):
        return _any_needs_pinning(value.values())
    return callable(getattr(value, "pin_memory", None))


def _any_needs_pinning(values: Iterable[Any]) -> bool:
    for value in values:
        if type(value) not in _PLAIN_TYPES and needs_pinning(value):
            return True
    return False


def _fields_to_walk_in(kind: type) -> tuple[str, ...]:
    """What :func:`needs_pinning` looks at in instances of ``kind``: the fields of a dataclass
    that pins by walking them (but those in ``_LOADER_MADE_FIELDS``), ``_OWN_PINNING`` for one
    with its own ``pin_memory()``, nothing (``()``) for other classes."""
    if not dataclasses.is_dataclass(kind):
        return ()
    own = getattr(kind, "pin_memory", None)
    if own is not None and own is not PinMemoryMixin.pin_memory:
        return _OWN_PINNING
    return tuple(
        field.name for field in dataclasses.fields(kind) if field.name not in _LOADER_MADE_FIELDS
    )


def _replace_fields(obj: TSelf, transform: Any) -> TSelf:
    """Shallow copy of a dataclass instance with ``transform`` applied to every field value.

    Copies instead of calling the constructor, so fields with ``init=False`` and frozen classes
    work too.
    """
    import copy

    clone = copy.copy(obj)
    for field in dataclasses.fields(obj):
        object.__setattr__(clone, field.name, transform(getattr(obj, field.name)))
    return clone


class PinMemoryMixin:
    """Adds ``pin_memory()``, which torch's DataLoader calls on batches when ``pin_memory=True``."""

    __slots__ = ()

    def pin_memory(self: TSelf) -> TSelf:
        """Return a copy whose tensors (also nested in containers) live in page-locked memory."""
        return _replace_fields(self, pin_memory_recursive)


class ExtendableDataclassMixin:
    """Adds ``Cls.extend(base_instance, **extra_fields)`` to build a subclass from a base instance."""

    __slots__ = ()

    @classmethod
    def extend(cls: type[TSelf], src: Any, **kwargs: Any) -> TSelf:
        """Copy every field of ``src`` (an instance of a base class of ``cls``) and add ``kwargs``.

        Typical use: ``MySample.extend(captioning_sample, tokens=...)`` in an encoder.
        """
        if not (dataclasses.is_dataclass(src) and issubclass(cls, type(src))):
            raise TypeError(
                f"{cls.__name__}.extend() needs an instance of a dataclass base of "
                f"{cls.__name__}, got {type(src).__name__}"
            )
        values = {f.name: getattr(src, f.name) for f in dataclasses.fields(src) if f.init}
        values.update(kwargs)
        return cls(**values)


class FieldAccessMixin:
    """Read access by field name (``sample["image"]``), for code written against dict samples.

    Only field names are accepted. Iteration is explicitly disabled: a ``__getitem__`` alone would
    make Python try ``sample[0]``, ``sample[1]``, ... when someone writes ``for x in sample``.
    """

    __slots__ = ()

    __iter__ = None  # type: ignore[assignment]

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str) or name not in _field_names(type(self)):
            raise KeyError(
                f"{type(self).__name__} has no field {name!r}; fields: "
                f"{', '.join(_field_names(type(self)))}"
            )
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in _field_names(type(self))


_FIELD_NAME_CACHE: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """Field names of a dataclass type, cached because ``dataclasses.fields`` is slow-ish."""
    names = _FIELD_NAME_CACHE.get(cls)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        _FIELD_NAME_CACHE[cls] = names
    return names


@edataclass
class Sample(FieldAccessMixin, PinMemoryMixin, ExtendableDataclassMixin, padding.PaddingFlag):
    """Base of all sample types; subclass it (``@edataclass`` or ``@dataclass``) to add fields."""

    #: Key of the sample inside its shard (the tar member name without extension).
    __key__: str
    #: Plain tuple from which the loader can re-create exactly this sample.
    __restore_key__: tuple[str | int | tuple, ...]
    #: Tags of the dataset this sample came from (set in the metadataset).
    __subflavors__: dict[str, Any] | None = None
    #: Where the sample was read from (files, shard, index); used in error messages.
    __sources__: tuple[SourceInfo, ...] | None = None

    @classmethod
    def derive_from(cls: type[TSelf], base_sample: Any, **kwargs: Any) -> TSelf:
        """New ``cls`` instance that keeps the base fields of ``base_sample`` (key, restore key,
        subflavors, sources, padding flag) so that an encoded sample can still be traced and
        restored. Base fields given in ``kwargs`` win over the copied ones."""
        base = {name: _read_field(base_sample, name) for name in BASE_SAMPLE_FIELDS}
        base.update(kwargs)
        derived = cls(**base)
        padding.copy_flag(base_sample, derived)
        return derived

    @classmethod
    def from_joined(cls: type[TSelf], *args: Any, **kwargs: Any) -> TSelf:
        """Default joiner for joined datasets: fields of the primary (first) sample, overwritten
        by the non-base fields of each further non-None sample in order (later wins).

        Only fields of ``cls`` are taken. ``__sources__`` lists every origin once (the reference
        repeats the primary's sources, S33). Write your own joiner for anything smarter.
        """
        if kwargs:
            raise TypeError(
                f"{cls.__name__}.from_joined() takes the joined samples positionally; "
                "write a custom joiner to receive them by name"
            )
        if not args or args[0] is None:
            raise ValueError(f"{cls.__name__}.from_joined() needs a primary (first) sample")
        names = set(_field_names(cls))
        values: dict[str, Any] = {}
        for position, sample in enumerate(args):
            if sample is None:
                continue
            for name in _sample_field_names(sample):
                if name in names and (position == 0 or name not in BASE_SAMPLE_FIELDS):
                    values[name] = _read_field(sample, name)
        values["__sources__"] = unique_sources(
            _read_field(s, "__sources__") for s in args if s is not None
        )
        return cls(**values)


def _read_field(sample: Any, name: str) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name)
    return getattr(sample, name, None)


def _sample_field_names(sample: Any) -> tuple[str, ...]:
    if isinstance(sample, Mapping):
        return tuple(sample.keys())
    return _field_names(type(sample))


class CrudeSample(dict):
    """A sample as a plain dict of decoded parts (plus ``__key__`` etc.) for datasets without a
    sample type; a cooker turns it into a typed sample."""

    __slots__ = ()
