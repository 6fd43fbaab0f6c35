"""``megatron.energon.typed_converter``: checking raw (JSON/YAML) data against Python type hints
and building dataclasses and named tuples from it, with the reference's error messages
(``Type does not match, expected int at root -> A:x, got 'no'``).

Values are checked, not converted: a list stays a list where a tuple is expected, an enum's value
stays a value, as with the reference. Classes named by ``__module__``/``__class__`` are resolved
through energon's allow-list (:mod:`energon.format.typeref`), so a config file cannot name
arbitrary code.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from energon.compat.epathlib import EPath
from energon.errors import JsonValueError
from energon.format.typeref import resolve_class
from energon.samples.edataclass import edataclass

__all__ = ["EPath", "JsonParser", "JsonValueError", "edataclass", "to_json_object"]

TType = TypeVar("TType")
_PRIMITIVES = (int, float, str, bool, bytes)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """Field name -> (type, required) of a dataclass or NamedTuple."""
    hints = typing.get_type_hints(cls)
    if dataclasses.is_dataclass(cls):
        return {
            f.name: (
                hints.get(f.name, Any),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.init
        }
    defaults = getattr(cls, "_field_defaults", {})
    return {name: (hints.get(name, Any), name not in defaults) for name in cls._fields}


def _is_record(tp: Any) -> bool:
    return inspect.isclass(tp) and (
        dataclasses.is_dataclass(tp) or (issubclass(tp, tuple) and hasattr(tp, "_fields"))
    )


@edataclass
class JsonParser:
    """Checks raw data against type hints; ``strict``: no keys beyond a record's fields."""

    strict: bool = True

    def raw_to_typed(
        self,
        raw_data: dict | list | str | int | bool | float | None,
        inst_type: type[TType],
        allow_imports: bool = False,
        _path: str = "root",
        _stage: tuple[int, ...] = (),
    ) -> TType:
        """``raw_data`` as ``inst_type`` (records are built, everything else is checked)."""
        if allow_imports and isinstance(raw_data, dict) and "__module__" in raw_data:
            return self.raw_to_instance(raw_data, inst_type, _path, _stage)
        origin = typing.get_origin(inst_type)
        if inst_type is Any or inst_type is object or isinstance(inst_type, TypeVar):
            return raw_data  # type: ignore[return-value]
        if origin is typing.Union or type(inst_type).__name__ == "UnionType":
            return self._union(raw_data, inst_type, allow_imports, _path, _stage)
        if origin is typing.Literal:
            if raw_data not in typing.get_args(inst_type):
                raise self._mismatch(inst_type, raw_data, _path, _stage)
            return raw_data  # type: ignore[return-value]
        if origin in (list, tuple, set, frozenset, dict):
            return self._container(raw_data, inst_type, origin, allow_imports, _path, _stage)
        if _is_record(inst_type):
            if not isinstance(raw_data, dict):
                raise self._mismatch(inst_type, raw_data, _path, _stage)
            return self._record(raw_data, inst_type, allow_imports, _path, _stage)
        return self._simple(raw_data, inst_type, _path, _stage)

    def _mismatch(self, tp: Any, value: Any, path: str, stage: tuple[int, ...]) -> JsonValueError:
        return JsonValueError(
            f"Type does not match, expected {_type_name(tp)} at {path}, got {value!r}",
            tp,
            value,
            path,
            stage,
        )

    def _simple(self, raw: Any, tp: Any, path: str, stage: tuple[int, ...]) -> Any:
        if tp is float and isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if tp is int and isinstance(raw, bool):
            return raw
        if tp is EPath and isinstance(raw, str):
            return raw
        if inspect.isclass(tp) and not isinstance(raw, tp):
            if tp in _PRIMITIVES or tp in (list, dict, tuple) or raw is None:
                raise self._mismatch(tp, raw, path, stage)
        return raw

    def _union(self, raw: Any, tp: Any, allow_imports: bool, path: str, stage: tuple) -> Any:
        for option in typing.get_args(tp):
            if option is type(None):
                if raw is None:
                    return None
                continue
            try:
                return self.raw_to_typed(raw, option, allow_imports, path, stage)
            except JsonValueError:
                continue
        raise self._mismatch(tp, raw, path, stage)

    def _container(
        self, raw: Any, tp: Any, origin: type, allow_imports: bool, path: str, stage: tuple
    ) -> Any:
        args = typing.get_args(tp)
        expected = JsonValueError(
            f"Expected {_type_name(tp)} at {path}, got {raw!r}", tp, raw, path, stage
        )
        if origin is dict:
            if not isinstance(raw, dict):
                raise expected
            value_type = args[1] if len(args) == 2 else Any
            return {
                k: self.raw_to_typed(v, value_type, allow_imports, f"{path} -> {k}", (*stage, i))
                for i, (k, v) in enumerate(raw.items())
            }
        if not isinstance(raw, (list, tuple)):
            raise expected
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(raw):
                raise expected
            types_ = list(args)
        else:
            types_ = [args[0] if args else Any] * len(raw)
        return [
            self.raw_to_typed(v, t, allow_imports, f"{path} -> {i}", (*stage, i))
            for i, (v, t) in enumerate(zip(raw, types_))
        ]

    def _record(self, raw: dict, cls: type, allow_imports: bool, path: str, stage: tuple) -> Any:
        fields = _fields(cls)
        if self.strict and set(raw) - set(fields):
            raise JsonValueError(
                f"Additional attributes for {cls.__name__} at {path}, got {raw!r}",
                cls,
                raw,
                path,
                stage,
            )
        kwargs = {}
        for i, (name, (tp, required)) in enumerate(fields.items()):
            where = f"{path} -> {cls.__name__}:{name}"
            if name not in raw:
                if required:
                    raise JsonValueError(f"Missing value at {where}", tp, None, where, stage)
                continue
            kwargs[name] = self.raw_to_typed(raw[name], tp, allow_imports, where, (*stage, i))
        return cls(**kwargs)

    def raw_to_instance(
        self,
        kwargs: dict,
        inst_type: type[TType],
        _path: str = "root",
        _stage: tuple[int, ...] = (),
    ) -> TType:
        """Instantiate the class (or call the function) named by ``__module__`` and
        ``__class__`` / ``__function__`` with the remaining keys."""
        kwargs = dict(kwargs)
        module = kwargs.pop("__module__")
        is_function = "__function__" in kwargs
        name = kwargs.pop("__function__" if is_function else "__class__")
        target = resolve_class(module, name, where=_path, function=is_function)
        if _is_record(target):
            return self._record(kwargs, target, True, _path, _stage)
        return self.safe_call_function(kwargs, target, allow_imports=True)

    def safe_call_function(
        self,
        raw_data: dict | list | str | int | bool | float | None,
        fn: Callable[..., TType],
        allow_imports: bool = False,
    ) -> TType:
        """Call ``fn`` with ``raw_data`` (a dict of keyword arguments, a list of positional ones,
        or one value), each checked against ``fn``'s type hints."""
        hints = typing.get_type_hints(fn) if not inspect.isclass(fn) else {}
        if isinstance(raw_data, dict):
            args = {
                k: self.raw_to_typed(v, hints.get(k, Any), allow_imports, k)
                for k, v in raw_data.items()
            }
            return fn(**args)
        params = list(inspect.signature(fn).parameters)
        values = raw_data if isinstance(raw_data, list) else [raw_data]
        return fn(
            *[
                self.raw_to_typed(v, hints.get(p, Any), allow_imports, p)
                for v, p in zip(values, params)
            ]
        )

    def override(
        self,
        value: TType,
        overrides: Any,
        inst_type: type[TType] | None = None,
        allow_imports: bool = False,
        _path: str = "root",
        _stage: tuple[int, ...] = (),
    ) -> TType:
        """``value`` (a record) with fields replaced: ``{"a.b": 5}`` sets a nested field; a
        string value that holds JSON replaces a whole record."""
        for dotted, new in dict(overrides).items():
            value = self._override_one(value, dotted.split("."), new, allow_imports, _path)
        return value

    def _override_one(self, value: Any, keys: list[str], new: Any, imports: bool, path: str) -> Any:
        name, rest = keys[0], keys[1:]
        tp, _ = _fields(type(value))[name]
        where = f"{path} -> {type(value).__name__}:{name}"
        if rest:
            new_field = self._override_one(getattr(value, name), rest, new, imports, where)
        else:
            if isinstance(new, str) and _is_record(tp):
                new = json.loads(new)
            new_field = self.raw_to_typed(new, tp, imports, where)
        if dataclasses.is_dataclass(value):
            return dataclasses.replace(value, **{name: new_field})
        return value._replace(**{name: new_field})


def to_json_object(obj: Any) -> Any:
    """Records, lists and dicts as plain JSON-able data."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if dataclasses.is_dataclass(obj) and not inspect.isclass(obj):
        return {f.name: to_json_object(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {name: to_json_object(getattr(obj, name)) for name in obj._fields}
    if isinstance(obj, (list, tuple)):
        return [to_json_object(v) for v in obj]
    if isinstance(obj, dict):
        return {key: to_json_object(val) for key, val in obj.items()}
    raise RuntimeError(f"Unknown type {type(obj)}")
