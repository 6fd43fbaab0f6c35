"""Resolving ``{__module__, __class__}`` references from YAML without importing arbitrary code.

A YAML file must not be able to make the loader import and run modules nobody asked for. Classes are
taken from energon itself (``megatron.energon`` is accepted as a synonym), from modules the process
has already imported (the user's own code defining a custom sample type), or from modules listed in
the ``ENERGON_ALLOWED_MODULES`` environment variable (comma-separated prefixes).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import energon

ENERGON_MODULE_ALIASES = ("megatron.energon", "energon")


def _energon_namespace() -> Any:
    return energon


def _allowed_by_env(module: str) -> bool:
    allowed = [
        m.strip() for m in os.environ.get("ENERGON_ALLOWED_MODULES", "").split(",") if m.strip()
    ]
    return any(module == a or module.startswith(a + ".") for a in allowed)


def resolve_class(module: str, name: str, *, where: str = "") -> Any:
    """The object ``module.name`` under the rules above; a clear error otherwise."""
    origin = f" (in {where})" if where else ""
    if module in ENERGON_MODULE_ALIASES or module.startswith(("megatron.energon.", "energon.")):
        obj = getattr(_energon_namespace(), name, None)
        if obj is None:
            raise ValueError(f"energon has no class named {name!r}{origin}")
        return obj
    if module in sys.modules:
        mod = sys.modules[module]
    elif _allowed_by_env(module):
        mod = importlib.import_module(module)
    else:
        raise ValueError(
            f"Refusing to import module {module!r} named in YAML{origin}: import it in your program "
            f"before loading the dataset, or allow it with ENERGON_ALLOWED_MODULES={module}"
        )
    try:
        return getattr(mod, name)
    except AttributeError:
        raise ValueError(f"Module {module!r} has no attribute {name!r}{origin}") from None
