"""User code shipped with a dataset: ``sample_loader`` and ``part_filter`` in ``.nv-meta/``.

``dataset.yaml`` may say ``sample_loader: sample_loader.py:sample_loader`` and
``part_filter: sample_loader.py:part_filter`` (or a list of part names). The script is executed
in a fresh module namespace, once per path and process. What this module returns is a small
callable that remembers (path, function name) and pickles as such, so a dataset holding it can be
sent to worker processes, which load the script themselves.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Collection
from typing import Any

from energon import epath

__all__ = [
    "PartNameFilter",
    "ScriptFunction",
    "load_part_filter",
    "load_sample_loader",
    "load_script_module",
]

_MODULES: dict[str, types.ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def _read_text(path: Any) -> str:
    if hasattr(path, "read_text"):
        return path.read_text()
    return epath.read_text(str(path))  # local or remote (a dataset in object storage)


def load_script_module(path: Any) -> types.ModuleType:
    """Execute the Python file at ``path`` in a new module namespace (cached per path)."""
    cache_key = str(path)
    with _MODULES_LOCK:
        module = _MODULES.get(cache_key)
        if module is not None:
            return module
        source = _read_text(path)
        module = types.ModuleType(f"energon_script_{len(_MODULES)}")
        module.__file__ = cache_key
        exec(compile(source, cache_key, "exec"), module.__dict__)
        _MODULES[cache_key] = module
        return module


class ScriptFunction:
    """A function defined in a dataset script, resolved lazily and picklable by reference."""

    __slots__ = ("path", "name", "_function")

    def __init__(self, path: Any, name: str) -> None:
        self.path = path
        self.name = name
        self._function: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        """Load the script (if needed) and return the function; clear errors if it is missing."""
        if self._function is None:
            module = load_script_module(self.path)
            function = getattr(module, self.name, None)
            if not callable(function):
                raise AttributeError(f"{self.path} defines no function {self.name!r}")
            self._function = function
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ScriptFunction, (self.path, self.name))

    def __repr__(self) -> str:
        return f"ScriptFunction({str(self.path)!r}, {self.name!r})"


def _script_function(nv_meta_dir: Any, spec: str, default_name: str) -> ScriptFunction:
    """``"file.py:fn"`` (or ``"file.py"`` for ``default_name``) relative to ``nv_meta_dir``."""
    file_name, _, function_name = spec.partition(":")
    if not file_name.endswith(".py"):
        raise ValueError(f"Expected 'file.py:function', got {spec!r}")
    if hasattr(nv_meta_dir, "__truediv__"):
        script = nv_meta_dir / file_name
    else:
        script = epath.join(str(nv_meta_dir), file_name)  # a remote URL stays a URL
    function = ScriptFunction(script, function_name or default_name)
    function.resolve()  # fail at dataset build time, not in the first worker
    return function


def load_sample_loader(nv_meta_dir: Any, spec: str | Callable[..., Any]) -> Callable[..., Any]:
    """The ``sample_loader(raw: dict) -> dict`` function named by ``spec`` (default function
    name ``sample_loader``); callables are returned unchanged."""
    if callable(spec):
        return spec
    return _script_function(nv_meta_dir, spec, "sample_loader")


def load_part_filter(
    nv_meta_dir: Any, spec: str | Collection[str] | Callable[[str], bool] | None
) -> Callable[[str], bool] | None:
    """Normalise a ``part_filter`` to a predicate on part names (None = read every part).

    ``spec`` may be ``"file.py:fn"`` (default name ``part_filter``), a collection of part names,
    or a callable.
    """
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return _script_function(nv_meta_dir, spec, "part_filter")
    return PartNameFilter(spec)


class PartNameFilter:
    """Picklable membership predicate for a fixed set of part names."""

    __slots__ = ("names",)

    def __init__(self, names: Collection[str]) -> None:
        self.names = frozenset(names)

    def __call__(self, part_name: str) -> bool:
        return part_name in self.names

    def __reduce__(self) -> tuple[Any, ...]:
        return (PartNameFilter, (sorted(self.names),))

    def __repr__(self) -> str:
        return f"PartNameFilter({sorted(self.names)!r})"
