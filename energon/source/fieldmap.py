"""Field maps: how a dataset's parts become the fields of its sample type.

A ``dataset.yaml`` says e.g. ``field_map: {image: "jpg,png", caption: "json[caption],txt"}``.
Each spec is parsed once per dataset into a ``FieldMap``; per sample, ``apply`` tries the options
of each field in order and takes the first that resolves. Parsing up front means a typo fails at
dataset build time, and the set of parts that must be read and decoded is known before any I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from energon.errors import FieldAccessError

__all__ = [
    "FieldAccessError",
    "FieldMap",
    "FieldOption",
    "check_field_map",
    "resolve_field_map",
]

# Fields the loader fills in itself; a field map must not set them.
_LOADER_FIELDS = frozenset(
    {"__key__", "__restore_key__", "__subflavors__", "__sources__", "__padding__"}
)

_OPTION_RE = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_ACCESSOR_RE = re.compile(r"\[([^\[\]]*)\]")


@dataclasses.dataclass(frozen=True, slots=True)
class FieldOption:
    """One alternative of a spec: a part name followed by nested accessors, e.g.
    ``json[items][0]`` -> part ``json``, accessors ``("items", "0")``."""

    part: str
    accessors: tuple[str, ...]

    def resolve(self, parts: Mapping[str, Any]) -> Any:
        """The value at this option; raises LookupError/TypeError when it does not exist."""
        value = parts[self.part]
        for accessor in self.accessors:
            value = _access(value, accessor)
        return value

    def __str__(self) -> str:
        return self.part + "".join(f"[{a}]" for a in self.accessors)


def _access(container: Any, accessor: str) -> Any:
    """Index a mapping by the accessor text, a sequence by its integer value."""
    if isinstance(container, Mapping):
        return container[accessor]
    if isinstance(container, Sequence) and not isinstance(container, (str, bytes)):
        try:
            index = int(accessor)
        except ValueError:
            raise TypeError(f"list index {accessor!r} is not an integer") from None
        return container[index]
    raise TypeError(f"cannot index a {type(container).__name__} with [{accessor}]")


def _split_options(spec: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    options, depth, current = [], 0, []
    for char in spec:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            options.append("".join(current))
            current = []
        else:
            current.append(char)
    options.append("".join(current))
    return [option.strip() for option in options]


def parse_field_spec(field: str, spec: str | Sequence[str]) -> tuple[FieldOption, ...]:
    """Parse ``"jpg,png"`` / ``"json[a][b]"`` (or a list of such options) into options."""
    texts = _split_options(spec) if isinstance(spec, str) else [str(s).strip() for s in spec]
    options = []
    for text in texts:
        match = _OPTION_RE.match(text)
        if not text or match is None:
            raise ValueError(
                f"Invalid field map spec for field {field!r}: {spec!r} (option {text!r}); "
                "expected comma-separated options like 'jpg,png' or 'json[key][0]'"
            )
        part = match.group(1).strip()
        accessors = tuple(a.strip() for a in _ACCESSOR_RE.findall(match.group(2)))
        options.append(FieldOption(part, accessors))
    return tuple(options)


@dataclasses.dataclass(frozen=True)
class FieldMap:
    """A parsed field map: sample field -> options tried in order.

    ``parts`` holds the names of the parts any option reads: only these need to be read and
    decoded. It is computed once, since readers test every part of every sample against it.
    """

    fields: dict[str, tuple[FieldOption, ...]]
    specs: dict[str, str]
    parts: frozenset[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        names = frozenset(option.part for options in self.fields.values() for option in options)
        object.__setattr__(self, "parts", names)

    def apply(self, parts: Mapping[str, Any]) -> dict[str, Any]:
        """Sample field -> value for one sample's decoded ``parts``.

        Raises ``FieldAccessError`` naming the field, its spec and ``parts["__key__"]`` when no
        option resolves; the reason is the last option's failure.
        """
        values: dict[str, Any] = {}
        for field, options in self.fields.items():
            values[field] = self._resolve_field(field, options, parts)
        return values

    def _resolve_field(
        self, field: str, options: tuple[FieldOption, ...], parts: Mapping[str, Any]
    ) -> Any:
        for option in options[:-1]:
            try:
                return option.resolve(parts)
            except (LookupError, TypeError):
                continue
        try:
            return options[-1].resolve(parts)
        except (LookupError, TypeError) as exc:
            available = ", ".join(sorted(k for k in parts if not k.startswith("__")))
            reason = "; ".join(_describe_failure(option, parts) for option in options)
            reason += f" (parts present: {available or 'none'})"
            raise FieldAccessError(field, self.specs[field], parts.get("__key__"), reason) from exc


def _describe_failure(option: FieldOption, parts: Mapping[str, Any]) -> str:
    """Why ``option`` does not resolve (re-evaluated only on the error path)."""
    if option.part not in parts:
        return f"part {option.part!r} is missing"
    try:
        option.resolve(parts)
    except (LookupError, TypeError) as exc:
        return f"{option} failed: {type(exc).__name__}: {exc}"
    return f"{option} resolved on retry"


def resolve_field_map(
    field_map: Mapping[str, str | Sequence[str]] | FieldMap, sample_type: type | None = None
) -> FieldMap:
    """Parse a ``field_map`` once per dataset; with ``sample_type``, also check it against the
    sample type's fields (see ``check_field_map``)."""
    if isinstance(field_map, FieldMap):
        parsed = field_map
    else:
        parsed = FieldMap(
            fields={name: parse_field_spec(name, spec) for name, spec in field_map.items()},
            specs={
                name: spec if isinstance(spec, str) else ",".join(spec)
                for name, spec in field_map.items()
            },
        )
    if sample_type is not None:
        check_field_map(sample_type, parsed.fields)
    return parsed


def check_field_map(sample_type: type, mapped_fields: Mapping[str, Any] | Sequence[str]) -> None:
    """Fail at dataset build time if the map names unknown fields or leaves required ones out.

    Required = fields without a default that the loader does not fill itself. The reference
    meant to check this but its check never fires (S4), so a missing field only failed per sample.
    """
    if not dataclasses.is_dataclass(sample_type):
        raise TypeError(f"Sample type {sample_type!r} is not a dataclass")
    fields = {f.name: f for f in dataclasses.fields(sample_type) if f.init}
    mapped = set(mapped_fields)
    type_name = sample_type.__name__
    reserved = sorted(mapped & _LOADER_FIELDS)
    if reserved:
        raise ValueError(
            f"Field map for {type_name} sets {reserved}, which the loader fills in itself"
        )
    unknown = sorted(mapped - fields.keys())
    if unknown:
        raise ValueError(
            f"Field map names {unknown}, which are not fields of {type_name} "
            f"(fields: {sorted(set(fields) - _LOADER_FIELDS)})"
        )
    missing = sorted(
        name
        for name, f in fields.items()
        if name not in mapped and name not in _LOADER_FIELDS and _is_required(f)
    )
    if missing:
        raise ValueError(f"Field map for {type_name} does not map required field(s) {missing}")


def _is_required(field: dataclasses.Field) -> bool:
    return (
        field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING  # type: ignore[misc]
    )
