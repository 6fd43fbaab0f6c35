"""The machinery of ``import megatron.energon``: a finder that serves each reference module path
with the one energon module the map names (``energon.compat.modules.REFERENCE_MODULES``).
Importing ``energon.megatron_alias`` installs it (:func:`install`); this module only defines it,
so ``energon.compat`` can use it without installing anything.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from energon.compat.modules import energon_module_for
from energon.errors import MegatronEnergonInstalledError


class _KeepBindingsModule(types.ModuleType):
    """Python binds an imported submodule as an attribute of its parent. Under the alias a parent
    is an energon module whose names must stay what they are (``megatron.energon.epathlib.epath``
    must not replace the ``epath`` that ``energon.compat.epathlib`` uses), so an existing binding
    is never replaced by a module."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and name in self.__dict__:
            if self.__dict__[name] is not value:
                return
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> types.ModuleType:
        return reference_submodule(self, name)


def reference_submodule(module: types.ModuleType, name: str) -> types.ModuleType:
    """``from megatron.energon.<path> import <submodule>``: Python looks the submodule up under the
    energon module's own name; look it up under the reference paths the module serves instead."""
    for path in sorted(getattr(module, "__energon_reference_paths__", ())):
        if energon_module_for(f"{path}.{name}") is not None:
            return importlib.import_module(f"{path}.{name}")
    raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")


class _AliasLoader(importlib.abc.Loader):
    """Hands out the already imported energon module instead of creating a new one."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        if type(module) is types.ModuleType:
            module.__class__ = _KeepBindingsModule
        paths = module.__dict__.setdefault("__energon_reference_paths__", set())
        paths.add(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the energon module is complete."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``megatron.energon[.X]`` through the module map (first on ``sys.meta_path``)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        module_name = energon_module_for(fullname)
        if module_name is None:
            return None  # not ours, or an unmapped path (the usual ModuleNotFoundError follows)
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(module_name))
        target_module = sys.modules.get(module_name)
        if target_module is not None and hasattr(target_module, "__path__"):
            spec.submodule_search_locations = list(target_module.__path__)
        return spec


def _real_megatron_energon() -> str | None:
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return None
    try:
        spec = importlib.util.find_spec("megatron.energon")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def install() -> None:
    """Register the alias (idempotent)."""
    origin = _real_megatron_energon()
    if origin is not None:
        raise MegatronEnergonInstalledError(
            f"megatron-energon is installed ({origin}); energon will not shadow it. Uninstall it "
            "(pip uninstall megatron-energon) or import energon directly."
        )
    if any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        return
    try:
        parent = importlib.import_module("megatron")
    except ImportError:
        parent = types.ModuleType("megatron")
        parent.__path__ = []  # a namespace for the alias only
        sys.modules["megatron"] = parent
    sys.meta_path.insert(0, _AliasFinder())
    energon = importlib.import_module("megatron.energon")
    energon.__energon_alias__ = True
    parent.energon = energon
